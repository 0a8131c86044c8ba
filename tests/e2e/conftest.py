"""An API server of the project (`ragline serve`) with test keys, against the running local stack;
and a worker and an API of their own for the sources tests."""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from tests.e2e.helpers import MAX_FILE_BYTES, Server, start_server, stop_server
from tests.e2e.own_stack import OwnStack, own_stack

# Redis databases: the stack 0, the S3 pass 1, test_pii_turns 10, test_observability 11,
# test_ingest_url 12, the quiet database no worker serves 13, the sources stack 14.
SOURCES_REDIS_DB = 14


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("api"), {"RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE_BYTES)}
    )
    yield handle
    stop_server(process)


def local_s3(settings: Settings) -> dict[str, str]:
    """The local S3 server's endpoint and keys, as deploy/local/s3.sh wrote them."""
    path = settings.state_dir / "s3" / "blobs.env"
    if not path.is_file():
        pytest.fail(f"{path} is missing: is the s3 service up? (bash deploy/local/stack.sh up s3)")
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="session")
def sources_stack(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[OwnStack]:
    """What the sources tests sync on: sources reach loopback servers (the fetch policy allows
    127.0.0.1, which the stack's own worker refuses), and the deployment's S3 keys (the local S3
    server's) serve the buckets `src-<tenant>-*`."""
    store = local_s3(settings)
    env = {
        "RAGLINE_FETCH__ALLOW": '["127.0.0.1"]',
        "RAGLINE_SOURCES__S3_ENDPOINT_URL": store["RAGLINE_BLOBS__ENDPOINT_URL"],
        "RAGLINE_SOURCES__S3_ACCESS_KEY_ID": store["RAGLINE_BLOBS__ACCESS_KEY_ID"],
        "RAGLINE_SOURCES__S3_SECRET_ACCESS_KEY": store["RAGLINE_BLOBS__SECRET_ACCESS_KEY"],
        "RAGLINE_SOURCES__S3_BUCKETS": json.dumps(["src-{tenant}-*"]),
    }
    with own_stack(tmp_path_factory.mktemp("sources"), settings, SOURCES_REDIS_DB, env) as own:
        yield own


@pytest.fixture
def folder(settings: Settings) -> Iterator[Path]:
    """A new directory inside the folder roots the workers may read, removed afterwards."""
    roots = settings.sources.folder_roots
    assert roots, "RAGLINE_SOURCES__FOLDER_ROOTS is not set: run the tests with deploy/local/test.sh"
    path = Path(str(roots[0]).replace("{tenant}", "")) / f"folder-{secrets.token_hex(4)}"
    path.mkdir(parents=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)

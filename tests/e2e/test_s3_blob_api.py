"""The API with its blob store in a bucket of the local S3 server (deploy/local/s3.sh): /readyz says
whether the store can serve, and an upload the store cannot take is UNAVAILABLE, never a 500: with a
bucket that does not exist (named in the answer) and with the server stopped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.config import Settings
from tests.e2e.helpers import Server, start_server, stop_server
from tests.integration.stack_control import stack

pytestmark = pytest.mark.e2e

QUIET_DB = 13  # no worker serves it


def _local_s3(settings: Settings) -> dict[str, str]:
    path = settings.state_dir / "s3" / "blobs.env"
    if not path.is_file():
        pytest.fail(f"no {path}: start the local S3 server with `bash deploy/local/stack.sh up s3`")
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _api(tmp: Path, settings: Settings, bucket: str | None = None) -> Iterator[Server]:
    env = _local_s3(settings)
    bucket = bucket or env["RAGLINE_BLOBS__URL"].removeprefix("s3://").split("/")[0]
    env["RAGLINE_BLOBS__URL"] = f"s3://{bucket}/e2e-{uuid.uuid4().hex[:8]}"
    # A Redis database of its own: the stack's workers read another store, and an API beside them
    # on this bucket would refuse every upload as not theirs (tests/e2e/test_blob_store_mismatch.py).
    env["RAGLINE_REDIS__URL"] = settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}"
    server, process = start_server(tmp, env)
    try:
        yield server
    finally:
        stop_server(process)


@pytest.fixture
def api(tmp_path: Path, settings: Settings) -> Iterator[Server]:
    yield from _api(tmp_path, settings)


@pytest.fixture
def api_without_bucket(tmp_path: Path, settings: Settings) -> Iterator[Server]:
    yield from _api(tmp_path, settings, bucket=f"ragline-missing-{uuid.uuid4().hex[:8]}")


def _upload(client: httpx.Client) -> httpx.Response:
    kb = f"kb-{uuid.uuid4().hex[:8]}"
    assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
    note = [("files", ("tides.txt", b"High water at six, low water at noon.\n", "text/plain"))]
    return client.post(f"/v1/kbs/{kb}/documents", files=note)


def _blob_check(server: Server) -> dict[str, object]:
    with server.client(None) as client:
        checks: dict[str, dict[str, object]] = client.get("/readyz").json()["checks"]
    return checks["blobs"]


def test_a_bucket_that_does_not_exist_is_named_and_nothing_is_accepted(api_without_bucket: Server) -> None:
    assert _blob_check(api_without_bucket)["ok"] is False
    with api_without_bucket.client("a_admin") as client:
        response = _upload(client)
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "UNAVAILABLE"
        assert "does not exist" in response.json()["message"]
        assert "ragline-missing-" in response.json()["message"]


def test_the_store_stopped_makes_uploads_unavailable_until_it_is_back(api: Server) -> None:
    assert _blob_check(api) == {"ok": True}
    stack("down", "s3")
    try:
        assert _blob_check(api)["ok"] is False
        with api.client("a_admin") as client:
            response = _upload(client)
        assert response.status_code == 503, response.text
        assert response.json()["code"] == "UNAVAILABLE"
        assert "unreachable" in response.json()["message"]
    finally:
        stack("up", "s3")
    assert _blob_check(api) == {"ok": True}

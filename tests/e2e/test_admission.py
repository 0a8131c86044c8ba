"""Every front meets the same admission rule, and a refused upload leaves nothing behind.

A server of its own, on a Redis database no worker serves and with its own state dir, so the
documents it admits stay where the test counts them (their lane, its blob store) and the bounds
are small: 1 interactive document in flight per tenant, 2 waiting in the lanes, 64-byte
interactive documents, 4 KiB files.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from shared import fairqueue
from shared.config import Settings
from shared.search.client import build_client
from shared.search.schema import docs_index
from tests.e2e.helpers import Server, error_text, http_session, start_server, stop_server, tenant_of

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

QUIET_DB = 13  # no worker serves it (the integration tests of the fair queue use it too)
MAX_FILE = 4096


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def quiet_redis(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(_quiet_url(settings))
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


def _quiet_url(settings: Settings) -> str:
    return settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("admission-state")


@pytest.fixture(scope="module")
def tight(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, state_dir: Path, quiet_redis: redis.Redis
) -> Iterator[Server]:
    env = {
        "RAGLINE_REDIS__URL": _quiet_url(settings),
        "RAGLINE_STATE_DIR": str(state_dir),
        "RAGLINE_API__MAX_QUEUED_TASKS": "2",
        "RAGLINE_API__INTERACTIVE_MAX_IN_FLIGHT": "1",
        "RAGLINE_API__INTERACTIVE_MAX_BYTES": "64",
        "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE),
        "RAGLINE_API__RETRY_AFTER_S": "7",
    }
    handle, process = start_server(tmp_path_factory.mktemp("admission-api"), env)
    yield handle
    stop_server(process)


@pytest.fixture
def kb(tight: Server, settings: Settings, quiet_redis: redis.Redis) -> Iterator[str]:
    """A fresh KB of tenant a. Deleting it afterwards empties its lane and removes every record, even
    those written a moment before (no reconciler finds them later)."""
    kb_id = f"adm-{uuid.uuid4().hex[:8]}"
    tenant = tenant_of(tight, "a_admin")
    with tight.client("a_admin") as api:
        created = api.post(
            "/v1/kbs", json={"kb_id": kb_id, "name": "admission", "settings": {"pii_policy": "off"}}
        )
        assert created.status_code == 201, created.text
        yield kb_id
        assert api.delete(f"/v1/kbs/{kb_id}").status_code == 204
    client = build_client(settings.opensearch)
    client.indices.refresh(index=docs_index(settings))
    scope = {"bool": {"filter": [{"term": {"tenant_id": tenant}}, {"term": {"kb_id": kb_id}}]}}
    assert client.count(index=docs_index(settings), body={"query": scope})["count"] == 0
    assert fairqueue.pending(quiet_redis, tenant) == 0


def _limited(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.json()["code"] == "RATE_LIMITED"
    assert response.headers["retry-after"] == "7"


async def test_json_multipart_mcp_reingest_and_cli_uploads_all_meet_the_bound(
    tight: Server, kb: str, quiet_redis: redis.Redis
) -> None:
    tenant = tenant_of(tight, "a_admin")
    large = "A report longer than an interactive document may be. " * 2  # over 64 bytes
    with tight.client("a_admin") as api:
        # The one interactive slot of the tenant.
        first = api.post(
            f"/v1/kbs/{kb}/documents",
            files={"files": ("agent.txt", b"Agent note.")},
            data={"priority": "interactive"},
        )
        assert first.status_code == 202, first.text
        # JSON over the interactive size waits in the lane (old: it skipped admission altogether).
        for i in range(2):
            response = api.post(f"/v1/kbs/{kb}/documents", json={"content": large, "doc_id": f"large-{i}"})
            assert response.status_code == 202, response.text
        assert fairqueue.pending(quiet_redis, tenant) == 2
        _limited(api.post(f"/v1/kbs/{kb}/documents", json={"content": large, "doc_id": "large-2"}))
        # Asking for interactive over the quota is no way around the bound.
        _limited(
            api.post(
                f"/v1/kbs/{kb}/documents",
                files={"files": ("second.txt", b"Second.")},
                data={"priority": "interactive"},
            )
        )
        # The CLI's bulk uploads, a multi-file request and a re-ingest neither.
        _limited(
            api.post(
                f"/v1/kbs/{kb}/documents", files={"files": ("bulk.txt", b"Bulk.")}, data={"priority": "bulk"}
            )
        )
        _limited(
            api.post(
                f"/v1/kbs/{kb}/documents", files=[("files", ("m1.txt", b"1")), ("files", ("m2.txt", b"2"))]
            )
        )
        _limited(api.post(f"/v1/kbs/{kb}/documents/large-0/reingest"))
        assert api.get(f"/v1/kbs/{kb}/documents/second.txt").status_code == 404
    async with http_session(tight, "a_admin") as session:
        result = await session.call_tool(
            "ingest", {"kb_id": kb, "content": "An agent's note.", "doc_id": "mcp-note"}
        )
        assert error_text(result).startswith("RATE_LIMITED:")
    assert fairqueue.pending(quiet_redis, tenant) == 2


def _blob_files(state_dir: Path) -> list[Path]:
    return sorted(p for p in (state_dir / "blobstore" / "blobs").rglob("*") if p.is_file())


@pytest.mark.parametrize(
    "doc_id",
    ["x" * 600, "../../etc/passwd", "nul\x00byte", "new\nline", "invoice\u202egnp.exe", "/etc/passwd"],
    ids=["600-chars", "dot-dot", "nul", "newline", "bidi-override", "leading-slash"],
)
def test_a_bad_doc_id_is_refused_before_any_byte_is_stored(
    tight: Server, kb: str, state_dir: Path, doc_id: str
) -> None:
    before = _blob_files(state_dir)
    body = f"Content for a refused id {uuid.uuid4().hex}.".encode()
    with tight.client("a_admin") as api:
        multipart = api.post(
            f"/v1/kbs/{kb}/documents", files={"files": ("f.txt", body)}, data={"doc_id": doc_id}
        )
        inline = api.post(f"/v1/kbs/{kb}/documents", json={"content": body.decode(), "doc_id": doc_id})
        listed = api.get(f"/v1/kbs/{kb}/documents").json()["documents"]
    for response in (multipart, inline):
        assert response.status_code == 422, response.text
        assert response.json()["code"] == "INVALID_ARGUMENT"
    assert listed == []
    assert _blob_files(state_dir) == before


def test_an_oversized_file_is_refused_without_repeating_its_name(
    tight: Server, kb: str, state_dir: Path
) -> None:
    name = f"private-plans-{uuid.uuid4().hex}.txt"
    before = _blob_files(state_dir)
    with tight.client("a_admin") as api:
        response = api.post(f"/v1/kbs/{kb}/documents", files={"files": (name, b"x" * (MAX_FILE + 1))})
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "TOO_LARGE"
    assert name not in response.text
    assert "private-plans" not in response.text
    assert _blob_files(state_dir) == before

"""What an upload may carry besides its content, and what a big JSON upload costs the others.

A server of its own, with its own state dir (its blob store is counted) and on a Redis database
no worker serves, with 24 MiB files: caller metadata out of bounds is refused on every front
before any byte is stored; a JSON upload's body, which the route reads whole, is bounded as it
streams. The API's memory is read from /proc as in test_request_intake.py.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from shared.config import Settings
from tests.e2e.helpers import Server, error_text, http_session, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MIB = 1 << 20
MAX_FILE = 24 * MIB
QUIET_DB = 13  # no worker serves it: the one accepted document stays where it was stored
SECRET = "secret-metadata-5b1e"
OVER_LIMIT_MIB = 150
# Far less than the body: what the API may hold of a JSON upload it refuses as it streams (the
# part it read up to the JSON upload limit, about 30 MiB here).
MAX_GROWTH_MIB = OVER_LIMIT_MIB // 2


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bounds-state")


@pytest.fixture(scope="module")
def api(
    tmp_path_factory: pytest.TempPathFactory, settings: Settings, state_dir: Path
) -> Iterator[tuple[Server, int]]:
    env = {
        "RAGLINE_REDIS__URL": settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}",
        "RAGLINE_STATE_DIR": str(state_dir),
        "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE),
    }
    handle, process = start_server(tmp_path_factory.mktemp("bounds-api"), env)
    yield handle, process.pid
    stop_server(process)


@pytest.fixture(scope="module")
def server(api: tuple[Server, int]) -> Server:
    return api[0]


@pytest.fixture(scope="module")
def kb(server: Server, settings: Settings) -> Iterator[str]:
    kb_id = f"bounds-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as client:
        created = client.post(
            "/v1/kbs", json={"kb_id": kb_id, "name": "bounds", "settings": {"pii_policy": "off"}}
        )
        assert created.status_code == 201, created.text
        yield kb_id
        assert client.delete(f"/v1/kbs/{kb_id}").status_code == 204
    queue = redis.Redis.from_url(settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}")
    queue.flushdb()
    queue.close()


def _blob_files(state_dir: Path) -> list[Path]:
    return sorted(p for p in (state_dir / "blobstore" / "blobs").rglob("*") if p.is_file())


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": SECRET}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


# Each under Starlette's 1 MiB limit of a multipart field, so every front reads it whole.
OUT_OF_BOUNDS = {
    "long-list": ({"k": [0] * 300_000}, "list_items"),
    "many-objects": ({"k": [{}] * 200_000}, "list_items"),
    "oversize": ({"note": SECRET * 5000}, "bytes"),
    "many-keys": ({f"{SECRET}-{i}": i for i in range(1001)}, "keys"),
    "deep": (_nested(9), "depth"),
    "long-key": ({SECRET * 20: 1}, "key_chars"),
}


@pytest.mark.parametrize("name", sorted(OUT_OF_BOUNDS))
async def test_metadata_out_of_bounds_is_refused_on_every_front_before_any_byte_is_stored(
    server: Server, kb: str, state_dir: Path, name: str
) -> None:
    metadata, bound = OUT_OF_BOUNDS[name]
    before = _blob_files(state_dir)
    content = f"Content of a refused upload {uuid.uuid4().hex}."
    with server.client("a_admin") as client:
        inline = client.post(
            f"/v1/kbs/{kb}/documents",
            json={"content": content, "doc_id": f"{name}-json", "metadata": metadata},
        )
        multipart = client.post(
            f"/v1/kbs/{kb}/documents",
            files={"files": ("f.txt", content.encode())},
            data={"doc_id": f"{name}-multipart", "metadata": json.dumps(metadata)},
        )
    for response in (inline, multipart):
        assert response.status_code == 422, response.text[:500]
        body = response.json()
        assert body["code"] == "INVALID_ARGUMENT"
        assert body["details"]["bound"] == bound
        assert SECRET not in response.text
    async with http_session(server, "a_admin") as session:
        result = await session.call_tool(
            "ingest", {"kb_id": kb, "content": content, "doc_id": f"{name}-mcp", "metadata": metadata}
        )
        text = error_text(result)
        assert text.startswith("INVALID_ARGUMENT:"), text[:500]
        assert SECRET not in text
    assert _blob_files(state_dir) == before
    with server.client("a_admin") as client:
        assert client.get(f"/v1/kbs/{kb}/documents").json()["documents"] == []


def test_metadata_within_the_bounds_is_stored(server: Server, kb: str, state_dir: Path) -> None:
    before = _blob_files(state_dir)
    metadata = {"team": "docs", "tags": ["a", "b"], "nested": _nested(7)}
    with server.client("a_admin") as client:
        response = client.post(
            f"/v1/kbs/{kb}/documents", json={"content": "Kept.", "doc_id": "kept", "metadata": metadata}
        )
        assert response.status_code == 202, response.text
        assert client.get(f"/v1/kbs/{kb}/documents/kept").json()["metadata"] == metadata
    assert len(_blob_files(state_dir)) == len(before) + 1


def _status_kib(proc: Path, field: str) -> int:
    line = next(line for line in (proc / "status").read_text().splitlines() if line.startswith(f"{field}:"))
    return int(line.split()[1])


def _streamed(body: bytes) -> Iterator[bytes]:
    for start in range(0, len(body), MIB):
        yield body[start : start + MIB]


def test_a_json_upload_over_its_limit_is_refused_as_it_streams(
    api: tuple[Server, int], kb: str, state_dir: Path
) -> None:
    server, pid = api
    before_blobs = _blob_files(state_dir)
    body = b'{"content":"' + b"a" * (OVER_LIMIT_MIB * MIB) + b'"}'
    proc = Path(f"/proc/{pid}")
    with server.client("a_admin") as client:
        before = _status_kib(proc, "VmRSS")
        (proc / "clear_refs").write_text("5")  # resets VmHWM to the current resident size
        response = client.post(
            f"/v1/kbs/{kb}/documents",
            content=_streamed(body),
            headers={"Content-Type": "application/json"},
        )
        growth_mib = (_status_kib(proc, "VmHWM") - before) / 1024
        declared = client.post(
            f"/v1/kbs/{kb}/documents", content=body, headers={"Content-Type": "application/json"}
        )
    for refused in (response, declared):
        assert refused.status_code == 413, refused.text[:500]
        assert refused.json()["code"] == "TOO_LARGE"
    print(f"peak growth of the API: {growth_mib:.0f} MiB for a {OVER_LIMIT_MIB} MiB JSON body")
    assert growth_mib < MAX_GROWTH_MIB
    assert _blob_files(state_dir) == before_blobs


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e400", '"\\ud800"'])
def test_metadata_that_is_no_json_value_is_refused(server: Server, kb: str, value: str) -> None:
    """Python's JSON parser reads these; stored, the numbers became null and the surrogate a 500."""
    raw = f'{{"k": {value}}}'
    with server.client("a_admin") as client:
        inline = client.post(
            f"/v1/kbs/{kb}/documents",
            content=f'{{"content": "Refused.", "doc_id": "nan-json", "metadata": {raw}}}'.encode(),
            headers={"content-type": "application/json"},
        )
        multipart = client.post(
            f"/v1/kbs/{kb}/documents",
            files={"files": ("f.txt", b"Refused.")},
            data={"doc_id": "nan-multipart", "metadata": raw},
        )
        for response in (inline, multipart):
            assert response.status_code == 422, response.text[:500]
            assert response.json()["code"] == "INVALID_ARGUMENT"
        for doc_id in ("nan-json", "nan-multipart"):
            assert client.get(f"/v1/kbs/{kb}/documents/{doc_id}").status_code == 404


async def test_a_blob_store_folder_made_a_file_is_unavailable_not_a_server_error(
    server: Server, kb: str, state_dir: Path
) -> None:
    """Its temporary folder replaced by a file: every front answers UNAVAILABLE without the path,
    readiness says the store cannot serve, and uploads go through again once it is a folder."""
    tmp = state_dir / "blobstore" / "tmp"
    shutil.rmtree(tmp)
    tmp.write_bytes(b"not a folder")
    try:
        with server.client("a_admin") as client:
            inline = client.post(f"/v1/kbs/{kb}/documents", json={"content": "x", "doc_id": "unwritable"})
            multipart = client.post(f"/v1/kbs/{kb}/documents", files={"files": ("u.txt", b"x")})
            for response in (inline, multipart):
                assert response.status_code == 503, response.text[:500]
                assert response.json()["code"] == "UNAVAILABLE"
                assert str(state_dir) not in response.text
            ready = _readiness_once_blobs_are(client, ok=False)
            assert ready.status_code == 503
            assert ready.json()["checks"]["blobs"] == {"ok": False, "error": "OutageError"}
        async with http_session(server, "a_admin") as session:
            result = await session.call_tool(
                "ingest", {"kb_id": kb, "content": "x", "doc_id": "unwritable-mcp"}
            )
            assert error_text(result).startswith("UNAVAILABLE:")
    finally:
        tmp.unlink()
    with server.client("a_admin") as client:
        ready = _readiness_once_blobs_are(client, ok=True)
        assert ready.json()["checks"]["blobs"] == {"ok": True}
        accepted = client.post(f"/v1/kbs/{kb}/documents", json={"content": "x", "doc_id": "unwritable"})
        assert accepted.status_code == 202, accepted.text
        assert client.get(f"/v1/kbs/{kb}/documents/unwritable").status_code == 200
        assert client.get(f"/v1/kbs/{kb}/documents/unwritable-mcp").status_code == 404


def _readiness_once_blobs_are(client: httpx.Client, *, ok: bool) -> httpx.Response:
    """Readiness answers are shared for a moment: ask until the store's check says `ok` (bounded)."""
    deadline = time.monotonic() + 10
    while True:
        response = client.get("/readyz")
        if response.json()["checks"]["blobs"]["ok"] is ok or time.monotonic() > deadline:
            return response
        time.sleep(0.2)

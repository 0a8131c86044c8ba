"""Hostile uploads through the real REST API: names that try to be paths, files over the limits.

A file name is a label: it never becomes a path, and the document is stored under its id. Size
limits hold whether or not the request declares its length, and a refused upload leaves nothing.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.config import REPO_ROOT, Settings
from tests.e2e.helpers import MAX_FILE_BYTES, Server, start_server, stop_server, wait_ready, wait_until
from tests.fixtures import hostile

pytestmark = pytest.mark.e2e

MAX_REQUEST_BYTES = 1 << 20  # the request limit of this module's own server
STEP = 64 << 10


def _new_kb(client: httpx.Client) -> str:
    kb_id = f"kb-{uuid.uuid4().hex[:8]}"
    response = client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id})
    assert response.status_code == 201, response.text
    return kb_id


def _blob_count(settings: Settings) -> int:
    blobs = settings.state_dir / "blobstore" / "blobs"
    return sum(1 for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else 0


def _name_targets(settings: Settings, names: list[str]) -> list[Path]:
    blob_root = settings.state_dir / "blobstore"
    bases = [settings.state_dir, blob_root, *blob_root.iterdir(), REPO_ROOT, Path.cwd()]
    return hostile.name_targets(names, [*bases, Path(tempfile.gettempdir())])


def test_names_that_try_to_be_paths_are_only_labels(server: Server, settings: Settings) -> None:
    names = list(hostile.PATH_NAMES)
    targets = _name_targets(settings, names)
    before = hostile.snapshot(targets)
    with server.client("a_admin") as client:
        kb = _new_kb(client)
        files = [
            (
                "files",
                (name, f"Tide table {i}, under a name that tries to be a path.\n".encode(), "text/plain"),
            )
            for i, name in enumerate(names)
        ]
        # Three of the names are one label ("passwd"): in one form the later would replace the
        # earlier, each answered as accepted, so the form is refused whole.
        together = client.post(f"/v1/kbs/{kb}/documents", files=files)
        assert together.status_code == 422, together.text
        assert together.json()["details"]["files"] == [0, 2]
        accepted = []
        for file in files:  # one at a time, a later one is an update of the same document
            response = client.post(f"/v1/kbs/{kb}/documents", files=[file])
            assert response.status_code == 202, response.text
            accepted += response.json()["documents"]
        for name, item in zip(names, accepted, strict=True):
            print(f"\n{name!r} -> label {item['filename']!r}, doc id {item['doc_id']!r}", end="")
            base = name.replace("\\", "/").rsplit("/", 1)[-1]
            assert item["filename"] == base
            assert item["doc_id"] == base
        doc_ids = sorted({item["doc_id"] for item in accepted})
        assert doc_ids == ["passwd", "win.ini"]
        docs = wait_ready(client, kb, doc_ids)
        assert {d: v["status"] for d, v in docs.items()} == dict.fromkeys(doc_ids, "ready")

        def listed() -> list[str]:
            return sorted(d["doc_id"] for d in client.get(f"/v1/kbs/{kb}/documents").json()["documents"])

        wait_until(lambda: listed() == doc_ids)
    assert hostile.snapshot(targets) == before


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("api-small"),
        {
            "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE_BYTES),
            "RAGLINE_API__MAX_REQUEST_BYTES": str(MAX_REQUEST_BYTES),
        },
    )
    yield handle
    stop_server(process)


def _multipart(boundary: str, name: str, size: int) -> Iterator[bytes]:
    """A one-file multipart body streamed in pieces, so it goes out chunked, with no length."""
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="files"; filename="{name}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    for offset in range(0, size, STEP):
        yield b"\0" * min(STEP, size - offset)
    yield f"\r\n--{boundary}--\r\n".encode()


def test_files_over_the_limits_are_refused_and_leave_nothing(
    small_server: Server, settings: Settings
) -> None:
    blobs_before = _blob_count(settings)
    bomb = hostile.pdf_bomb(MAX_FILE_BYTES >> 10)  # ~1 KiB per MiB inflated: over the file limit
    assert MAX_FILE_BYTES < len(bomb) < MAX_REQUEST_BYTES
    with small_server.client("a_admin") as client:
        kb = _new_kb(client)
        url = f"/v1/kbs/{kb}/documents"
        refused = {
            "file over the file limit": client.post(
                url, files=[("files", ("bomb.pdf", bomb, "application/pdf"))]
            ),
            "streamed, no length, over the request limit": client.post(
                url,
                content=_multipart("b0undary", "big.bin", MAX_REQUEST_BYTES + STEP),
                headers={"content-type": "multipart/form-data; boundary=b0undary"},
            ),
            "declared length over the request limit": client.post(
                url,
                files=[("files", ("big.bin", b"\0" * (MAX_REQUEST_BYTES + 1), "application/octet-stream"))],
            ),
        }
        for case, response in refused.items():
            print(f"\n{case}: {response.status_code} {response.text}")
            assert response.status_code == 413, (case, response.text)
            assert response.json()["code"] == "TOO_LARGE", case
        assert "chunked" in refused["streamed, no length, over the request limit"].request.headers.get(
            "transfer-encoding", ""
        )
        assert client.get(url).json()["documents"] == []
        assert client.get("/healthz").status_code == 200
    assert _blob_count(settings) == blobs_before

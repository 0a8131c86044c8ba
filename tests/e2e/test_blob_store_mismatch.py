"""An API started on another state dir than its workers' refuses uploads and says it is not ready:
the bytes it stored would be where no worker looks, each document failing long after its 202."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import start_server, stop_server

pytestmark = pytest.mark.e2e


def test_an_api_whose_blob_store_no_worker_reads_refuses_uploads(tmp_path: Path) -> None:
    state = tmp_path / "another-state"
    server, process = start_server(tmp_path, {"RAGLINE_STATE_DIR": str(state)})
    try:
        with server.client("a_admin") as client:
            ready = client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert ready.json()["checks"]["blobs"] == {"ok": False, "error": "NOT_THE_WORKERS_STORE"}
            assert str(tmp_path) not in ready.text
            kb = client.post("/v1/kbs", json={"kb_id": "elsewhere", "name": "elsewhere"})
            assert kb.status_code == 201, kb.text
            uploads = [
                {"files": [("files", ("note.txt", b"A note.", "text/plain"))]},
                {"json": {"content": "A note."}},
            ]
            for upload in uploads:
                refused = client.post("/v1/kbs/elsewhere/documents", **upload)  # type: ignore[arg-type]
                assert refused.status_code == 503, refused.text
                assert refused.json()["code"] == "UNAVAILABLE"
                assert "RAGLINE_STATE_DIR" in refused.json()["message"]
                assert str(tmp_path) not in refused.text
            assert client.get("/v1/kbs/elsewhere/documents").json()["documents"] == []
            assert client.delete("/v1/kbs/elsewhere").status_code == 204
    finally:
        stop_server(process)
    assert not [p for p in (state / "blobstore" / "blobs").rglob("*") if p.is_file()]
    assert str(state / "blobstore") in server.log.read_text()  # the operator's log names the store

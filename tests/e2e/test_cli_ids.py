"""`ragline doc` with ids a URL would misread, against a real API: `..` escapes nothing, and ids
with `?`, `#`, `%`, `/` or spaces reach their own document."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import uuid
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.helpers import Server, run_cli

pytestmark = pytest.mark.e2e

ODD_IDS = ["q?a=1#frag", "dir/with space/100%.txt", "%2F..%2F"]


def _doc(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAGLINE_API_KEY": server.keys["a_admin"]}
    return run_cli(["doc", *args, "--server", server.url], env)


@pytest.fixture
def kb(server: Server) -> tuple[httpx.Client, str]:
    client = server.client("a_admin")
    kb_id = f"ids-{uuid.uuid4().hex[:6]}"
    assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
    for doc_id in ["x", *ODD_IDS]:
        body = {"content": f"Document {doc_id}: terns dive for sand eels.", "doc_id": doc_id}
        accepted = client.post(f"/v1/kbs/{kb_id}/documents", json=body)
        assert accepted.status_code == 202, accepted.text
    return client, kb_id


def test_dot_segments_in_a_doc_id_delete_nothing_else(server: Server, kb: tuple[httpx.Client, str]) -> None:
    client, kb_id = kb
    for doc_id in ("x/../..", "..", "x/.."):
        result = _doc(server, "delete", "--kb", kb_id, doc_id, "--yes")
        assert result.returncode == 1, (doc_id, result.stdout, result.stderr)
        assert result.stderr.startswith(("NOT_FOUND", "INVALID_ARGUMENT")), (doc_id, result.stderr)
    # The same path sent literally (no client resolves its dot segments) reaches no other route.
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    connection.request(
        "DELETE", f"/v1/kbs/{kb_id}/documents/x/../..", headers={"X-Api-Key": server.keys["a_admin"]}
    )
    literal = connection.getresponse()
    assert literal.status in (400, 404, 422), (literal.status, literal.read())
    connection.close()
    assert client.get(f"/v1/kbs/{kb_id}").status_code == 200  # the knowledge base is still there
    assert client.get(f"/v1/kbs/{kb_id}/documents/x").json()["status"] != "deleted"


@pytest.mark.parametrize("doc_id", ODD_IDS)
def test_odd_ids_round_trip_through_the_cli(
    server: Server, kb: tuple[httpx.Client, str], doc_id: str
) -> None:
    _, kb_id = kb
    shown = _doc(server, "status", "--kb", kb_id, doc_id)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["doc_id"] == doc_id
    deleted = _doc(server, "delete", "--kb", kb_id, doc_id, "--yes")
    assert deleted.returncode == 0, deleted.stderr
    assert json.loads(deleted.stdout)["doc_id"] == doc_id
    for other in ["x", *ODD_IDS]:
        if other != doc_id:
            still = _doc(server, "status", "--kb", kb_id, other)
            assert json.loads(still.stdout)["status"] != "deleted", other

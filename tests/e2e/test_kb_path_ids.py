"""A KB id with an encoded `/` (or `..`) never reaches a document route: the server refuses the
path as sent, and the CLI refuses the id before sending it."""

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


def _ragline(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAGLINE_API_KEY": server.keys["a_admin"]}
    return run_cli([*args, "--server", server.url], env)


def _raw(server: Server, method: str, path: str) -> tuple[int, dict[str, object]]:
    """`path` sent byte for byte, as curl sends it (no client re-encodes or resolves it)."""
    url = urlsplit(server.url)
    connection = http.client.HTTPConnection(url.hostname or "", url.port, timeout=60)
    try:
        connection.request(method, path, headers={"X-Api-Key": server.keys["a_admin"]})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@pytest.fixture
def kb(server: Server) -> tuple[httpx.Client, str]:
    client = server.client("a_admin")
    kb_id = f"kbpath-{uuid.uuid4().hex[:6]}"
    assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
    for doc_id in ("x", "y", "dir/z"):
        body = {"content": f"Document {doc_id}: puffins nest in burrows.", "doc_id": doc_id}
        accepted = client.post(f"/v1/kbs/{kb_id}/documents", json=body)
        assert accepted.status_code == 202, accepted.text
    return client, kb_id


def _alive(client: httpx.Client, kb_id: str, doc_id: str) -> bool:
    path = f"/v1/kbs/{kb_id}/documents/{doc_id.replace('/', '%2F')}"
    return client.get(path).json()["status"] not in ("deleted", "deleting")


def test_an_encoded_slash_in_the_kb_segment_is_refused(server: Server, kb: tuple[httpx.Client, str]) -> None:
    client, kb_id = kb
    for method, path in [
        ("DELETE", f"/v1/kbs/{kb_id}%2Fdocuments%2Fy"),
        ("DELETE", f"/v1/kbs/{kb_id}%2fdocuments%2fy"),
        ("GET", f"/v1/kbs/{kb_id}%2Fdocuments%2Fy"),
        ("DELETE", f"/v1/kbs/{kb_id}%2Fdocuments/y"),
        ("GET", "/v1/kbs/%2E%2E"),
        ("DELETE", f"/v1/kbs/%2E%2E%2F{kb_id}"),
    ]:
        status, body = _raw(server, method, path)
        assert (status, body.get("code")) == (422, "INVALID_ARGUMENT"), (method, path, body)
    assert _alive(client, kb_id, "y")
    assert client.get(f"/v1/kbs/{kb_id}").status_code == 200
    # Encoded slashes in a document id, after /documents/, still address that document.
    status, body = _raw(server, "GET", f"/v1/kbs/{kb_id}/documents/dir%2Fz")
    assert (status, body.get("doc_id")) == (200, "dir/z"), body
    status, _ = _raw(server, "GET", f"/v1/kbs/%6B{kb_id[1:]}")  # an encoded letter is still the id
    assert status == 200


def test_the_cli_refuses_a_kb_id_that_is_no_kb_id(server: Server, kb: tuple[httpx.Client, str]) -> None:
    client, kb_id = kb
    for args in (
        ["kb", "delete", f"{kb_id}/documents/x", "--yes"],
        ["kb", "show", f"{kb_id}/documents/x"],
        ["doc", "status", "--kb", f"{kb_id}/documents/x", "x"],
        ["kb", "delete", "..", "--yes"],
    ):
        result = _ragline(server, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert result.stderr.startswith("INVALID_ARGUMENT"), (args, result.stderr)
        assert "deleted" not in result.stdout
    assert _alive(client, kb_id, "x")
    shown = _ragline(server, "kb", "show", kb_id)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["kb_id"] == kb_id

"""Ingest by URL, end to end: REST and MCP, a real HTTP server on loopback, the worker's fetch stage.

Loopback is what the fetch policy refuses by default, so most tests run a worker and an API of
their own (tests/e2e/own_stack.py) whose allowlist names 127.0.0.1, and nothing else: 127.0.0.2
and the metadata address stay refused. The default policy is shown on the session's API and the
stack's own worker, which have no allowlist.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.config import Settings
from tests.e2e.helpers import MAX_FILE_BYTES, Server, call, error_text, http_session, wait_ready
from tests.e2e.own_stack import own_stack
from tests.fixtures.web_server import WebServer, endless, page, redirect, serving, stall, status

pytestmark = pytest.mark.e2e

REDIS_DB = 12  # the stack uses 0, test_observability 11
FETCH_LIMIT = 64 << 10
GUIDE = b"# Fetch guide\n\nThe worker fetched this page from a loopback server: quokka zanzibar.\n"
EVERY_STAGE = ["queued", "fetching", "parsing", "chunking", "enriching", "redacting", "embedding", "indexing"]


@pytest.fixture(scope="module")
def web() -> Iterator[WebServer]:
    with serving() as server:
        server.routes["/guide.md"] = page(GUIDE, "text/markdown; charset=utf-8", etag='"g1"')
        yield server


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Server]:
    """An API and a worker that may fetch from 127.0.0.1, with short limits and quick retries."""
    env = {
        "RAGLINE_FETCH__ALLOW": '["127.0.0.1"]',
        "RAGLINE_FETCH__MAX_BYTES": str(FETCH_LIMIT),
        "RAGLINE_FETCH__READ_TIMEOUT_S": "2",
        "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE_BYTES),
        "RAGLINE_CELERY__MAX_RETRIES": "40",
        "RAGLINE_CELERY__RETRY_BACKOFF_MAX_S": "1",
    }
    with own_stack(tmp_path_factory.mktemp("url-ingest"), settings, REDIS_DB, env) as stack:
        yield stack.server


def _kb(client: httpx.Client) -> str:
    kb_id = f"url-{uuid.uuid4().hex[:8]}"
    assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": "By URL"}).status_code == 201
    return kb_id


def _ingest(client: httpx.Client, kb_id: str, url: str, **extra: Any) -> dict[str, Any]:
    answer = client.post(f"/v1/kbs/{kb_id}/documents", json={"url": url, **extra})
    assert answer.status_code == 202, answer.text
    (accepted,) = answer.json()["documents"]
    assert accepted["status"] == "queued"
    return dict(accepted)


def _settled(client: httpx.Client, kb_id: str, doc_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each document once ready or failed, as a user polls it."""
    return {doc_id: dict(doc) for doc_id, doc in wait_ready(client, kb_id, doc_ids).items()}


def _since_last_queued(doc: dict[str, Any]) -> list[str]:
    statuses = [t["status"] for t in doc["transitions"]]
    return statuses[len(statuses) - 1 - statuses[::-1].index("queued") :]


def _hits(client: httpx.Client, kb_id: str, query: str) -> list[dict[str, Any]]:
    answer = client.post("/v1/search", json={"query": query, "kb_ids": [kb_id], "mode": "keyword"})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["results"])


def test_rest_ingest_by_url_reaches_ready_and_is_searchable(allowed: Server, web: WebServer) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    url = web.url("/guide.md")
    accepted = _ingest(client, kb_id, url)
    doc_id = f"127.0.0.1-{web.port}/guide.md"
    assert (accepted["doc_id"], accepted["outcome"]) == (doc_id, "created")
    doc = _settled(client, kb_id, [doc_id])[doc_id]
    assert doc["status"] == "ready", doc["error"]
    assert _since_last_queued(doc) == [*EVERY_STAGE, "ready"]
    assert (doc["url"], doc["source_uri"], doc["mime_type"], doc["outcome"]) == (
        url,
        url,
        "text/markdown",
        "created",
    )
    assert doc["file_size"] == len(GUIDE)
    assert doc["fetch"]["etag"] == '"g1"'
    assert "fetch" in doc["timings"]
    seen = web.asked("/guide.md")[-1].headers
    assert seen["user-agent"].startswith("Ragline/")
    (hit,) = [h for h in _hits(client, kb_id, "quokka zanzibar") if h["doc_id"] == doc_id]
    assert hit["source_uri"] == url


def test_mcp_ingest_by_url_waits_for_ready(allowed: Server, web: WebServer) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    web.routes["/mcp-page.html"] = page(b"<html><body><h1>Agent page</h1><p>Wombat ledger.</p></body></html>")
    url = web.url("/mcp-page.html")

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with http_session(allowed, "a_admin") as session:
            ingested = await call(
                session, "ingest", kb_id=kb_id, url=url, doc_id="agent-page", wait_seconds=240
            )
            found = await call(session, "search", query="wombat ledger", kb_ids=[kb_id])
            return ingested, found

    ingested, found = asyncio.run(scenario())
    assert (ingested["doc_id"], ingested["outcome"], ingested["status"]) == ("agent-page", "created", "ready")
    document = ingested["document"]
    assert (document["source_uri"], document["mime_type"]) == (url, "text/html")
    assert [h["doc_id"] for h in found["results"]][:1] == ["agent-page"]


def test_the_same_url_again_ends_unchanged_and_new_bytes_update_it(allowed: Server, web: WebServer) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    web.routes["/tagged.md"] = page(b"# Tagged\n\nFirst words: marmot.\n", "text/markdown", etag='"t1"')
    web.routes["/untagged.md"] = page(b"# Untagged\n\nPlain words: narwhal.\n", "text/markdown")
    ids = {}
    for path in ("/tagged.md", "/untagged.md"):
        ids[path] = _ingest(client, kb_id, web.url(path))["doc_id"]
    first = _settled(client, kb_id, list(ids.values()))
    assert {d["status"] for d in first.values()} == {"ready"}

    # Fetched again: a 304 to the ETag (tagged), the same bytes (untagged): no work, still ready.
    for path, doc_id in ids.items():
        assert _ingest(client, kb_id, web.url(path))["outcome"] == "updated"
        again = _settled(client, kb_id, [doc_id])[doc_id]
        assert (again["status"], again["outcome"]) == ("ready", "unchanged"), again["error"]
        assert _since_last_queued(again) == ["queued", "fetching", "ready"]
        assert again["content_version"] == first[doc_id]["content_version"] + 1
        assert again["chunk_count"] == first[doc_id]["chunk_count"]
        assert again["active_generation"] == first[doc_id]["active_generation"]
    assert web.asked("/tagged.md")[-1].headers["if-none-match"] == '"t1"'
    assert [h["doc_id"] for h in _hits(client, kb_id, "marmot")] == [ids["/tagged.md"]]

    # New bytes go through the pipeline and replace the old version.
    web.routes["/tagged.md"] = page(b"# Tagged\n\nSecond words: pangolin.\n", "text/markdown", etag='"t2"')
    assert _ingest(client, kb_id, web.url("/tagged.md"))["outcome"] == "updated"
    changed = _settled(client, kb_id, [ids["/tagged.md"]])[ids["/tagged.md"]]
    assert (changed["status"], changed["outcome"]) == ("ready", "updated")
    assert _since_last_queued(changed) == [*EVERY_STAGE, "ready"]
    assert [h["doc_id"] for h in _hits(client, kb_id, "pangolin")] == [ids["/tagged.md"]]
    assert _hits(client, kb_id, "marmot") == []


def test_the_type_is_sniffed_from_the_bytes_as_for_uploads(allowed: Server, web: WebServer) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    html = b"<!doctype html><html><body><h1>Served as text</h1><p>Okapi.</p></body></html>"
    web.routes["/page.txt"] = page(html, "text/plain")
    web.routes["/notes"] = page(b"# Notes\n\n- a list item about lemurs\n", "text/markdown")
    web.routes["/report"] = page(b"name,count\nkoala,3\nemu,5\n", "application/octet-stream")
    docs = {
        path: _ingest(client, kb_id, web.url(path))["doc_id"] for path in ("/page.txt", "/notes", "/report")
    }
    found = _settled(client, kb_id, list(docs.values()))
    got = {
        path: (found[d]["status"], found[d]["mime_type"], found[d]["filename"]) for path, d in docs.items()
    }
    assert got == {
        "/page.txt": ("ready", "text/html", "page.txt"),  # the bytes say HTML, whatever the header
        "/notes": ("ready", "text/markdown", "notes.md"),  # a declared Markdown type names it
        "/report": ("ready", "text/plain", "report"),  # CSV only by name: a bare name stays text
    }


def test_fetch_failures_fail_the_document_with_their_code(allowed: Server, web: WebServer) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    web.routes["/big"] = endless()
    web.routes["/stall"] = stall()
    web.routes["/gone"] = status(404)
    web.routes["/to-metadata"] = redirect("http://169.254.169.254/latest/meta-data/")
    web.routes["/to-other-loopback"] = redirect(web.url("/guide.md", host="127.0.0.2"))
    expected = {
        "/big": "TOO_LARGE",
        "/stall": "TIMEOUT",
        "/gone": "FETCH_FAILED",
        "/to-metadata": "FETCH_REFUSED",
        "/to-other-loopback": "FETCH_REFUSED",
    }
    docs = {path: _ingest(client, kb_id, web.url(path))["doc_id"] for path in expected}
    found = _settled(client, kb_id, list(docs.values()))
    got = {
        path: (found[d]["status"], found[d]["error"]["code"], found[d]["error"]["stage"])
        for path, d in docs.items()
    }
    assert got == {path: ("failed", code, "fetch") for path, code in expected.items()}
    assert "server's own words" not in found[docs["/gone"]]["error"]["message"]


def test_a_target_that_is_down_is_retried_until_it_answers(allowed: Server) -> None:
    client = allowed.client("a_admin")
    kb_id = _kb(client)
    with socket.socket() as sock:  # a port nothing listens on yet
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    doc_id = _ingest(client, kb_id, f"http://127.0.0.1:{port}/later.md")["doc_id"]
    deadline = time.monotonic() + 120
    error: dict[str, Any] | None = None
    while error is None and time.monotonic() < deadline:
        doc = client.get(f"/v1/kbs/{kb_id}/documents/{doc_id}").json()
        assert doc["status"] != "failed", doc["error"]
        error = doc["error"]
        time.sleep(0.2)
    assert error is not None, "the fetch of a target that is down never recorded its failure"
    assert (error["code"], error["retryable"], error["stage"]) == ("FETCH_FAILED", True, "fetch")
    with serving(port) as later:
        later.routes["/later.md"] = page(b"# Later\n\nThe target came back: axolotl.\n", "text/markdown")
        doc = _settled(client, kb_id, [doc_id])[doc_id]
    assert (doc["status"], doc["error"]) == ("ready", None)
    assert later.asked("/later.md")


def test_the_api_refuses_what_the_url_itself_says(server: Server) -> None:
    client = server.client("a_admin")
    kb_id = _kb(client)
    refused = {
        "http://127.0.0.1:9200/_cat/indices": "FETCH_REFUSED",
        "http://[::1]:6379/": "FETCH_REFUSED",
        "http://10.0.0.1/": "FETCH_REFUSED",
        "http://169.254.169.254/latest/meta-data/": "FETCH_REFUSED",
        "http://metadata.google.internal/computeMetadata/v1/": "FETCH_REFUSED",
        "http://2130706433/": "FETCH_REFUSED",
        "http://0x7f.1/": "FETCH_REFUSED",
        "file:///etc/passwd": "FETCH_REFUSED",
        "http://user:secret@example.com/": "INVALID_ARGUMENT",
        "not a url": "INVALID_ARGUMENT",
    }
    for url, code in refused.items():
        answer = client.post(f"/v1/kbs/{kb_id}/documents", json={"url": url})
        assert (answer.status_code, answer.json()["code"]) == (422, code), url
    for body in (
        {"url": "https://example.com/", "content": "x"},
        {"url": "https://example.com/", "filename": "a.md"},
    ):
        answer = client.post(f"/v1/kbs/{kb_id}/documents", json=body)
        assert (answer.status_code, answer.json()["code"]) == (422, "INVALID_ARGUMENT"), body
    assert client.get(f"/v1/kbs/{kb_id}/documents").json()["documents"] == []

    async def over_mcp() -> str:
        async with http_session(server, "a_admin") as session:
            return error_text(
                await session.call_tool("ingest", {"kb_id": kb_id, "url": "http://[fd00:ec2::254]/"})
            )

    assert asyncio.run(over_mcp()).startswith("FETCH_REFUSED: ")


def test_the_default_policy_refuses_a_name_that_resolves_to_loopback(server: Server, web: WebServer) -> None:
    """The session's API and the stack's worker run without an allowlist: `localhost` passes the
    API (a name means nothing until resolved), and the worker refuses it after resolving it."""
    client = server.client("a_admin")
    kb_id = _kb(client)
    path = f"/guide.md?default-{uuid.uuid4().hex[:6]}"
    doc_id = _ingest(client, kb_id, web.url(path, host="localhost"))["doc_id"]
    doc = _settled(client, kb_id, [doc_id])[doc_id]
    assert (doc["status"], doc["error"]["code"], doc["error"]["stage"]) == (
        "failed",
        "FETCH_REFUSED",
        "fetch",
    )
    assert "loopback" in doc["error"]["message"]
    assert web.asked(path) == []

"""Streamable-HTTP sessions over real HTTP: bound to their key, capped per tenant, and the
documented body limit, with every refusal a JSON error."""

from __future__ import annotations

import contextlib
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.e2e

ACCEPT = {"Accept": "application/json, text/event-stream"}
VERSION = "2025-06-18"
SESSIONS_PER_TENANT = 3
MAX_FILE = 6 << 20
LIMIT = 4 * -(-MAX_FILE // 3) + (1 << 20)  # the documented default: base64 of the largest file
IDLE_S = 2


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with few sessions per tenant and a file limit over 5 MiB."""
    handle, process = start_server(
        tmp_path_factory.mktemp("capped"),
        {
            "RAGLINE_MCP__SESSIONS_PER_TENANT": str(SESSIONS_PER_TENANT),
            "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE),
        },
    )
    yield handle
    stop_server(process)


@pytest.fixture(scope="module")
def idling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with one session per tenant that ends sessions idle for 2 s."""
    handle, process = start_server(
        tmp_path_factory.mktemp("idling"),
        {"RAGLINE_MCP__SESSIONS_PER_TENANT": "1", "RAGLINE_MCP__SESSION_IDLE_S": str(IDLE_S)},
    )
    yield handle
    stop_server(process)


def _headers(server: Server, key: str, session: str | None = None) -> dict[str, str]:
    headers = {**ACCEPT, "X-Api-Key": server.keys[key], "Mcp-Protocol-Version": VERSION}
    return headers | ({"Mcp-Session-Id": session} if session else {})


def _open(client: httpx.Client, server: Server, key: str) -> httpx.Response:
    hello = {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    message = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
    return client.post("/mcp", json=message, headers=_headers(server, key))


def _open_once_free(client: httpx.Client, server: Server, key: str) -> httpx.Response:
    """`_open`, tried again while the tenant's place is still taken: a client sees its stream or
    session end a moment before the server has given the place back."""
    deadline = time.monotonic() + 10
    while (opened := _open(client, server, key)).status_code == 429 and time.monotonic() < deadline:
        time.sleep(0.2)
    return opened


def _session(client: httpx.Client, server: Server, key: str, *, once_free: bool = False) -> str:
    opened = _open_once_free(client, server, key) if once_free else _open(client, server, key)
    assert opened.status_code == 200, opened.text
    session = opened.headers["mcp-session-id"]
    notified = client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers=_headers(server, key, session),
    )
    assert notified.status_code == 202, notified.text
    return session


def _tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    params = {"name": name, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": secrets.randbelow(10**6), "method": "tools/call", "params": params}


def _call(
    client: httpx.Client, server: Server, key: str, session: str, name: str, **args: Any
) -> httpx.Response:
    return client.post("/mcp", json=_tool(name, args), headers=_headers(server, key, session))


def _as_other(client: httpx.Client, server: Server, key: str, session: str) -> list[tuple[int, str]]:
    """POST, GET and DELETE on `session` with `key`: status and body of each."""
    headers = _headers(server, key, session)
    posted = client.post("/mcp", json=_tool("list_knowledge_bases", {}), headers=headers)
    # A GET that the session accepts is an event stream that stays open: read only what a
    # refusal sends, its status and its short body.
    with client.stream("GET", "/mcp", headers={**headers, "Accept": "text/event-stream"}) as got:
        streamed = (got.status_code, got.read().decode() if got.status_code != 200 else "(a stream)")
    deleted = client.delete("/mcp", headers=headers)
    return [(posted.status_code, posted.text), streamed, (deleted.status_code, deleted.text)]


def test_another_key_can_neither_use_nor_end_a_session(server: Server) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        session = _session(client, server, "a_admin")
        unknown = _as_other(client, server, "b_admin", uuid.uuid4().hex)
        assert {status for status, _ in unknown} == {404}, unknown
        # Tenant B, and another key of tenant A, get what an unknown id gets: the id is not confirmed.
        for other in ("b_admin", "a_read"):
            assert _as_other(client, server, other, session) == unknown, other
        still = _call(client, server, "a_admin", session, "list_knowledge_bases")
        assert still.status_code == 200, still.text
        assert "knowledge_bases" in still.json()["result"]["structuredContent"]
        assert client.delete("/mcp", headers=_headers(server, "a_admin", session)).status_code == 200
        gone = _call(client, server, "a_admin", session, "list_knowledge_bases")
        assert gone.status_code == 404
    print(f"foreign session id: POST, GET, DELETE answered {[s for s, _ in unknown]}, as an unknown id")


def test_a_tenant_over_its_session_cap_is_refused_and_others_are_not(capped: Server) -> None:
    with httpx.Client(base_url=capped.url, timeout=60) as client:
        held = [_session(client, capped, "a_admin") for _ in range(SESSIONS_PER_TENANT)]
        refused = [_open(client, capped, key) for key in ("a_admin", "a_read")]
        for response in refused:
            assert response.status_code == 429, response.text
            assert response.json()["code"] == "RATE_LIMITED"
            assert response.json()["details"]["limit"] == SESSIONS_PER_TENANT
            assert int(response.headers["retry-after"]) >= 1
        other = _session(client, capped, "b_admin")  # tenant B is not held up by A's sessions
        assert _call(client, capped, "b_admin", other, "list_knowledge_bases").status_code == 200
        for session in held:  # A's sessions still work
            assert _call(client, capped, "a_admin", session, "list_knowledge_bases").status_code == 200
        assert client.delete("/mcp", headers=_headers(capped, "a_admin", held[0])).status_code == 200
        held[0] = _session(client, capped, "a_admin")  # an ended session makes room again
        for key, session in [*(("a_admin", s) for s in held), ("b_admin", other)]:
            client.delete("/mcp", headers=_headers(capped, key, session))
    print(f"sessions per tenant {SESSIONS_PER_TENANT}: the next two of tenant A got 429, tenant B opened one")


def _sse_status(client: httpx.Client, server: Server, key: str) -> int:
    """The status an SSE stream of `key` opens with (a refusal's, or 200 closed at once)."""
    with client.stream(
        "GET", "/mcp/sse", headers={"Accept": "text/event-stream", "X-Api-Key": server.keys[key]}
    ) as got:
        return got.status_code


def test_sse_streams_count_against_the_same_cap(capped: Server) -> None:
    headers = {"Accept": "text/event-stream", "X-Api-Key": capped.keys["a_admin"]}
    with httpx.Client(base_url=capped.url, timeout=60) as client, contextlib.ExitStack() as streams:
        held = [_session(client, capped, "a_admin") for _ in range(SESSIONS_PER_TENANT - 1)]
        stream = streams.enter_context(client.stream("GET", "/mcp/sse", headers=headers))
        assert stream.status_code == 200
        lines = stream.iter_lines()  # held: a dropped iterator closes the stream it reads
        assert next(lines).startswith("event: endpoint")
        refused = _open(client, capped, "a_admin")  # the stream took the last place
        assert refused.status_code == 429, refused.text
        assert _sse_status(client, capped, "a_read") == 429
        assert _sse_status(client, capped, "b_admin") == 200  # another tenant's place is its own
        streams.close()  # the stream ends: its place is free again
        del lines
        opened = _open_once_free(client, capped, "a_admin")
        assert opened.status_code == 200, opened.text
        held.append(opened.headers["mcp-session-id"])
        for session in held:
            client.delete("/mcp", headers=_headers(capped, "a_admin", session))


def test_an_idle_sse_stream_and_an_idle_session_end_and_free_their_tenants_place(idling: Server) -> None:
    """An SSE stream nobody used held its place against the cap for as long as it stayed open."""
    headers = {"Accept": "text/event-stream", "X-Api-Key": idling.keys["a_admin"]}
    with httpx.Client(base_url=idling.url, timeout=30) as client:
        with client.stream("GET", "/mcp/sse", headers=headers) as stream:
            assert stream.status_code == 200
            assert _open(client, idling, "a_admin").status_code == 429  # the stream holds the place
            lines = []
            deadline = time.monotonic() + 10 * IDLE_S
            for line in stream.iter_lines():  # until the server ends the stream
                lines.append(line)
                # The server pings an open stream every 15 s, so a stream that never ends fails here.
                assert time.monotonic() < deadline, "the idle SSE stream was never ended"
        assert lines[0].startswith("event: endpoint")
        session = _session(client, idling, "a_admin", once_free=True)  # the stream's place is free
        assert _call(client, idling, "a_admin", session, "list_knowledge_bases").status_code == 200
        deadline = time.monotonic() + 20
        while (used := _call(client, idling, "a_admin", session, "list_knowledge_bases")).status_code == 200:
            assert time.monotonic() < deadline, "the idle session never ended"
            time.sleep(IDLE_S + 1)
        assert used.status_code == 404, used.text
        again = _open_once_free(client, idling, "a_admin")
        assert again.status_code == 200, again.text
        client.delete("/mcp", headers=_headers(idling, "a_admin", again.headers["mcp-session-id"]))


def _big_page(size: int) -> str:
    """An HTML page of about `size` bytes, nearly all of it an inline script: little to index."""
    filler = "x" * (size - 200)
    body = "<body><p>Kittiwakes nest on cliffs.</p></body>"
    return f"<html><head><script>/*{filler}*/</script></head>{body}</html>"


def test_a_5_mib_ingest_passes_and_a_body_over_the_limit_gets_too_large(capped: Server) -> None:
    kb = f"kb-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=capped.url, timeout=120) as client:
        created = client.post(
            "/v1/kbs", json={"kb_id": kb, "name": kb}, headers={"X-Api-Key": capped.keys["a_admin"]}
        )
        assert created.status_code == 201, created.text
        session = _session(client, capped, "a_admin")
        page = _big_page(5 << 20)
        message = _tool("ingest", {"kb_id": kb, "content": page, "filename": "big.html"})
        accepted = client.post("/mcp", json=message, headers=_headers(capped, "a_admin", session))
        assert len(accepted.request.content) > 5 << 20
        assert accepted.status_code == 200, accepted.text[:500]
        result = accepted.json()["result"]
        assert not result["isError"], result["content"]
        assert result["structuredContent"]["outcome"] == "created"

        over = _tool("ingest", {"kb_id": kb, "content": _big_page(LIMIT + 1024), "filename": "over.html"})
        body = httpx.Request("POST", "/mcp", json=over).content
        declared = client.post("/mcp", content=body, headers=_headers(capped, "a_admin", session))
        streamed = client.post(  # no Content-Length: chunked, counted as it arrives
            "/mcp",
            content=(body[i : i + (1 << 20)] for i in range(0, len(body), 1 << 20)),
            headers=_headers(capped, "a_admin", session) | {"Content-Type": "application/json"},
        )
        for response in (declared, streamed):
            assert response.status_code == 413, response.text[:500]
            assert response.json()["code"] == "TOO_LARGE"
            assert response.json()["details"]["limit"] == LIMIT
        assert "content-length" not in streamed.request.headers
        # The session is still there after the refusals.
        assert _call(client, capped, "a_admin", session, "list_knowledge_bases").status_code == 200
        client.delete("/mcp", headers=_headers(capped, "a_admin", session))
    print(
        f"MCP body limit {LIMIT} bytes: {len(accepted.request.content)} accepted, {len(body)} refused twice"
    )

"""MCP as deployments configure it: a standalone server per transport, the API's mount switched
off or moved, and stateless streamable HTTP behind a load balancer without sticky sessions."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.helpers import Server, call, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class RoundRobin(httpx.AsyncBaseTransport):
    """A load balancer without sticky sessions: each request goes to the next backend in turn."""

    def __init__(self, backends: list[str]) -> None:
        self.backends = itertools.cycle(backends)
        self.served: Counter[str] = Counter()
        self.inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        backend = httpx.URL(next(self.backends))
        request.url = request.url.copy_with(host=backend.host, port=backend.port)
        request.headers["host"] = f"{backend.host}:{backend.port}"
        self.served[str(backend)] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@asynccontextmanager
async def balanced_session(
    servers: list[Server], key: str
) -> AsyncIterator[tuple[ClientSession, RoundRobin]]:
    balancer = RoundRobin([s.url for s in servers])
    headers = {"X-Api-Key": servers[0].keys[key]}
    async with (
        httpx.AsyncClient(transport=balancer, headers=headers, timeout=httpx.Timeout(60, read=300)) as http,
        streamable_http_client(f"{servers[0].url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session, balancer


def _same_keys(first: Server, tmp: Path, env: dict[str, str]) -> tuple[Server, object]:
    """A second API process with the first one's keys: replicas of one deployment."""
    second, process = start_server(tmp, {**env, "RAGLINE_AUTH__KEYS_FILE": str(first.keys_file)})
    return Server(second.url, first.keys, first.keys_file, second.log), process


@pytest.fixture(scope="module")
def stateless_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Server]]:
    env = {"RAGLINE_MCP__STATELESS": "true"}
    first, one = start_server(tmp_path_factory.mktemp("stateless-a"), env)
    second, two = _same_keys(first, tmp_path_factory.mktemp("stateless-b"), env)
    yield [first, second]
    for process in (one, two):
        stop_server(process)  # type: ignore[arg-type]


async def test_stateless_replicas_answer_one_client_in_turns(stateless_pair: list[Server]) -> None:
    received: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append(progress)

    kb = f"kb-{uuid.uuid4().hex[:6]}"
    async with balanced_session(stateless_pair, "a_admin") as (session, balancer):
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert {"search", "ingest", "create_knowledge_base"} <= names
        await call(session, "create_knowledge_base", kb_id=kb, name="replicas")
        ingested = await session.call_tool(
            "ingest",
            {"kb_id": kb, "content": "Beavers build lodges of sticks and mud.", "wait_seconds": 120},
            progress_callback=on_progress,
        )
        assert not ingested.isError, ingested.content
        assert ingested.structuredContent is not None
        assert ingested.structuredContent["status"] == "ready"
        for _ in range(4):
            found = await call(session, "search", query="what do beavers build?", kb_ids=[kb], top_k=3)
            assert found["results"][0]["doc_id"] == ingested.structuredContent["doc_id"]
        await call(session, "delete_document", kb_id=kb, doc_id=ingested.structuredContent["doc_id"])
    headers = {"X-Api-Key": stateless_pair[0].keys["a_admin"], "Accept": "text/event-stream"}
    async with httpx.AsyncClient(base_url=stateless_pair[0].url, headers=headers, timeout=10) as http:
        for method in ("GET", "DELETE"):  # a stream no message could reach, a session that is not
            answer = await http.request(method, "/mcp")
            assert (answer.status_code, answer.headers.get("allow")) == (405, "POST"), answer.text
    served = balancer.served
    print(f"requests per replica: {dict(served)}")
    assert set(served) == {s.url for s in stateless_pair}
    assert min(served.values()) >= 4
    assert received, "no progress came through the replica that ran the call"
    assert received[-1] == 1.0


async def test_stateful_replicas_lose_the_session_without_sticky_routing(
    server: Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The counterpart: with sessions, the second replica does not know the first one's session."""
    second, process = _same_keys(server, tmp_path_factory.mktemp("stateful-b"), {})
    headers = {"X-Api-Key": server.keys["a_admin"], "Accept": "application/json, text/event-stream"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}
    try:
        async with httpx.AsyncClient(headers=headers, timeout=60) as http:
            opened = await http.post(
                f"{server.url}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
            )
            session = {
                "Mcp-Session-Id": opened.headers["mcp-session-id"],
                "Mcp-Protocol-Version": "2025-06-18",
            }
            listing = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            elsewhere = await http.post(f"{second.url}/mcp", json=listing, headers=session)
            assert elsewhere.status_code == 404, elsewhere.text
            assert (await http.post(f"{server.url}/mcp", json=listing, headers=session)).status_code == 200
    finally:
        stop_server(process)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def standalone_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("mcp-http"), {}, command=("mcp", "--transport", "streamable-http")
    )
    yield handle
    stop_server(process)


async def test_a_standalone_streamable_http_server_serves_the_tools(standalone_http: Server) -> None:
    headers = {"Authorization": f"Bearer {standalone_http.keys['a_admin']}"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=60) as http,
        streamable_http_client(f"{standalone_http.url}/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        assert "search" in {tool.name for tool in (await session.list_tools()).tools}
        assert "knowledge_bases" in await call(session, "list_knowledge_bases")
    async with httpx.AsyncClient(base_url=standalone_http.url) as client:
        hello = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}
        assert (await client.post("/mcp", json=hello)).status_code == 401
        assert (await client.get("/v1/kbs")).status_code == 404  # MCP alone, no REST
        assert (await client.get("/mcp/sse")).status_code == 404  # the one transport asked for


async def test_a_standalone_sse_server_serves_the_tools(tmp_path: Path) -> None:
    handle, process = start_server(tmp_path, {}, command=("mcp", "--transport", "sse"))
    try:
        headers = {"X-Api-Key": handle.keys["a_read"]}
        async with (
            sse_client(f"{handle.url}/mcp/sse", headers=headers) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert "knowledge_bases" in await call(session, "list_knowledge_bases")
        async with httpx.AsyncClient(base_url=handle.url) as client:
            assert (await client.get("/mcp/sse")).status_code == 401
            assert (await client.post("/mcp", json={})).status_code == 404
    finally:
        stop_server(process)


async def test_the_api_mount_can_be_moved_or_switched_off(tmp_path: Path) -> None:
    (tmp_path / "moved").mkdir()
    (tmp_path / "off").mkdir()
    moved, process = start_server(tmp_path / "moved", {"RAGLINE_MCP__PATH": "/agents/mcp"})
    try:
        headers = {"X-Api-Key": moved.keys["a_read"]}
        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"{moved.url}/agents/mcp", http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            assert "knowledge_bases" in await call(session, "list_knowledge_bases")
        async with (
            sse_client(f"{moved.url}/agents/mcp/sse", headers=headers) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
        async with httpx.AsyncClient(base_url=moved.url, headers=headers) as client:
            assert (await client.post("/mcp", json={})).status_code == 404
    finally:
        stop_server(process)
    off, process = start_server(tmp_path / "off", {"RAGLINE_MCP__ENABLED": "false"})
    try:
        async with httpx.AsyncClient(base_url=off.url, headers={"X-Api-Key": off.keys["a_read"]}) as client:
            assert (await client.post("/mcp", json={})).status_code == 404
            assert (await client.get("/mcp/sse")).status_code == 404
            assert (await client.get("/v1/kbs")).status_code == 200
    finally:
        stop_server(process)

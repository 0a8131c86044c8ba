"""MCP `search` latency over streamable HTTP: `concurrency` agents, each in its own session; and
MCP against REST query by query, through the SDK's client, through a bare one, and through the
client install's stdio proxy (`ragline mcp --server`) in front of the same server."""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

RAGLINE = str(Path(sys.executable).parent / "ragline")


async def _agent(server: str, api_key: str, kb: str, todo: asyncio.Queue[str], out: list[float]) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    async with (
        streamablehttp_client(f"{server}/mcp", headers=headers) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        while not todo.empty():
            query = todo.get_nowait()
            started = time.perf_counter()
            result = await session.call_tool("search", {"query": query, "kb_ids": [kb]})
            if result.isError:
                raise RuntimeError(f"MCP search failed: {result.content}")
            out.append((time.perf_counter() - started) * 1000)


def mcp_search_ms(server: str, api_key: str, kb: str, queries: list[str], concurrency: int) -> list[float]:
    """Milliseconds per MCP search call; opening the sessions is not timed."""

    async def run() -> list[float]:
        todo: asyncio.Queue[str] = asyncio.Queue()
        for query in queries:
            todo.put_nowait(query)
        out: list[float] = []
        await asyncio.gather(*(_agent(server, api_key, kb, todo, out) for _ in range(concurrency)))
        return out

    return asyncio.run(run())


def client_validation_ms(server: str, api_key: str, kb: str, query: str, repeats: int = 30) -> float:
    """Median ms the SDK's ClientSession spends checking one search result against the tool's output
    schema (`jsonschema.validate`, as `call_tool` runs it): client-side time inside the MCP figures."""

    async def run() -> float:
        headers = {"Authorization": f"Bearer {api_key}"}
        async with (
            streamablehttp_client(f"{server}/mcp", headers=headers) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            result = await session.call_tool("search", {"query": query, "kb_ids": [kb]})
        schema = tools["search"].outputSchema
        if schema is None or result.structuredContent is None:
            raise RuntimeError("MCP search has no structured output to check")
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            jsonschema.validate(result.structuredContent, schema)
            times.append((time.perf_counter() - started) * 1000)
        return statistics.median(times)

    return asyncio.run(run())


PROTOCOL = "2025-06-18"


class BareSession:
    """JSON-RPC over streamable HTTP with no SDK: a POST, the whole SSE answer read, its JSON
    parsed. What an MCP call costs the server and the transport, without the SDK client's own
    work (message models, SSE parsing, its check of every result against the output schema)."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http, self.url, self.headers = http, url, {"accept": "application/json, text/event-stream"}
        self.ids = 0

    async def post(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self.ids += 1
        message = {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params or {}}
        response = await self.http.post(self.url, json=message, headers=self.headers)
        response.raise_for_status()
        if response.headers.get("content-type", "").startswith("application/json"):
            return dict(response.json())
        data = [line[5:] for line in response.text.splitlines() if line.startswith("data:")]
        answers = [json.loads(d) for d in data if '"id"' in d]
        return dict(answers[-1])

    async def initialize(self) -> None:
        response = await self.http.post(
            self.url,
            json={
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "bench"}},
            },
            headers=self.headers,
        )
        response.raise_for_status()
        self.headers |= {
            "mcp-session-id": response.headers["mcp-session-id"],
            "mcp-protocol-version": PROTOCOL,
        }
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        (await self.http.post(self.url, json=done, headers=self.headers)).raise_for_status()


async def _sdk_session(stack: AsyncExitStack, streams: Any) -> ClientSession:
    read, write = (await stack.enter_async_context(streams))[:2]
    session = await stack.enter_async_context(ClientSession(read, write))
    await session.initialize()
    return session


def paired_ms(server: str, api_key: str, kb: str, queries: list[str]) -> dict[str, list[float]]:
    """Milliseconds of each query through REST, MCP with the SDK client, MCP with a bare client and
    MCP through the stdio proxy (SDK client to `ragline mcp --server`, which calls the server over
    its own session), one after the other (the order turning with each query), at concurrency 1:
    the paths meet the same moments of a shared machine, so their differences are not its drift."""

    async def run() -> dict[str, list[float]]:
        headers = {"Authorization": f"Bearer {api_key}"}
        out: dict[str, list[float]] = {"rest": [], "mcp": [], "mcp_bare": [], "mcp_proxy": []}
        proxy = StdioServerParameters(
            command=RAGLINE,
            args=["mcp", "--server", server],
            env={**os.environ, "RAGLINE_API_KEY": api_key},
        )
        async with AsyncExitStack() as stack:
            http = await stack.enter_async_context(
                httpx.AsyncClient(base_url=server, headers=headers, timeout=60)
            )
            session = await _sdk_session(stack, streamablehttp_client(f"{server}/mcp", headers=headers))
            proxied = await _sdk_session(stack, stdio_client(proxy))
            bare = BareSession(http, f"{server}/mcp")
            await bare.initialize()

            async def rest(query: str) -> None:
                (await http.post("/v1/search", json={"query": query, "kb_ids": [kb]})).raise_for_status()

            async def mcp(query: str) -> None:
                result = await session.call_tool("search", {"query": query, "kb_ids": [kb]})
                if result.isError:
                    raise RuntimeError(f"MCP search failed: {result.content}")

            async def mcp_proxy(query: str) -> None:
                result = await proxied.call_tool("search", {"query": query, "kb_ids": [kb]})
                if result.isError:
                    raise RuntimeError(f"MCP search through the proxy failed: {result.content}")

            async def mcp_bare(query: str) -> None:
                answer = await bare.post(
                    "tools/call", {"name": "search", "arguments": {"query": query, "kb_ids": [kb]}}
                )
                if "error" in answer or answer["result"].get("isError"):
                    raise RuntimeError(f"MCP search failed: {answer}")

            paths: list[tuple[str, Callable[[str], Awaitable[None]]]] = [
                ("rest", rest),
                ("mcp", mcp),
                ("mcp_bare", mcp_bare),
                ("mcp_proxy", mcp_proxy),
            ]
            for i, query in enumerate(queries):
                turn = paths[i % len(paths) :] + paths[: i % len(paths)]
                # Trailing spaces make each path's query its own: no path answers from a warm cache.
                for spaces, (name, call) in enumerate(turn, start=1):
                    started = time.perf_counter()
                    await call(query + " " * spaces)
                    out[name].append((time.perf_counter() - started) * 1000)
        return out

    return asyncio.run(run())

"""MCP `search` latency over streamable HTTP: `concurrency` agents, each in its own session."""

from __future__ import annotations

import asyncio
import statistics
import time

import jsonschema
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client


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

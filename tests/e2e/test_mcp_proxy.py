"""`ragline mcp --server URL`: a stdio MCP server that serves a remote Ragline's tools, started as a
desktop client starts it, against a real API: the same tools and schemas, the same `CODE: message`
errors, ingest of a local file by path with its progress relayed, and UNAVAILABLE when the remote
cannot be reached."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.e2e.helpers import RAGLINE, Server, call, error_text, http_session

pytestmark = pytest.mark.e2e


@asynccontextmanager
async def proxy(url: str, key: str, ragline: str = RAGLINE) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(
        command=ragline,
        args=["mcp", "--server", url],
        env={"PATH": os.environ.get("PATH", ""), "RAGLINE_API_KEY": key},
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def _tools(listed: Any) -> dict[str, dict[str, Any]]:
    return {
        t.name: {"description": t.description, "input": t.inputSchema, "output": t.outputSchema}
        for t in listed.tools
    }


async def check_the_proxy_serves_the_remote_tools(server: Server, ragline: str) -> None:
    async with http_session(server, "a_admin") as direct:
        remote = _tools(await direct.list_tools())
    async with proxy(server.url, server.keys["a_admin"], ragline) as session:
        served = _tools(await session.list_tools())
    assert served.keys() == remote.keys()
    path_field = served["ingest"]["input"]["properties"].pop("path")
    assert path_field["type"] == "string"
    assert served == remote


def test_the_proxy_serves_the_remote_tools_with_their_schemas(server: Server) -> None:
    anyio.run(check_the_proxy_serves_the_remote_tools, server, RAGLINE)


async def _ingest_by_path_and_search(server: Server, folder: Path) -> None:
    kb = f"proxy-{uuid.uuid4().hex[:6]}"
    (folder / "gulls.md").write_text("# Gulls\n\nHerring gulls drop shellfish on rocks to open them.\n")
    seen_progress: list[float] = []

    async def seen(progress: float, total: float | None, message: str | None) -> None:
        seen_progress.append(progress)

    async with proxy(server.url, server.keys["a_admin"]) as session:
        await call(session, "create_knowledge_base", kb_id=kb, name=kb)
        result = await session.call_tool(
            "ingest",
            {"kb_id": kb, "path": str(folder / "gulls.md"), "wait_seconds": 120},
            progress_callback=seen,
        )
        assert not result.isError, result.content
        body = result.structuredContent
        assert body is not None
        assert body["doc_id"] == "gulls.md"
        assert body["status"] == "ready", body
        assert seen_progress, "no progress notification reached the proxy's client"
        hits = await call(session, "search", query="which bird opens shellfish on rocks", kb_ids=[kb])
        assert hits["results"][0]["doc_id"] == "gulls.md", hits
        missing = await session.call_tool("get_document_status", {"kb_id": kb, "doc_id": "nope"})
        assert error_text(missing).startswith("NOT_FOUND: "), missing
        unreadable = await session.call_tool("ingest", {"kb_id": kb, "path": str(folder / "absent.pdf")})
        assert error_text(unreadable).startswith("INVALID_ARGUMENT: path"), unreadable


def test_the_proxy_ingests_a_local_file_by_path_and_relays_progress(server: Server, tmp_path: Path) -> None:
    anyio.run(_ingest_by_path_and_search, server, tmp_path)


async def _search_through(url: str, key: str) -> str:
    async with proxy(url, key) as session:
        return error_text(await session.call_tool("search", {"query": "gulls"}))


def test_a_refused_key_is_an_auth_error(server: Server) -> None:
    text = anyio.run(_search_through, server.url, "not-a-key")
    assert text.startswith("AUTH_ERROR: "), text


def test_a_remote_that_is_gone_is_unavailable(server: Server) -> None:
    text = anyio.run(_search_through, "http://127.0.0.1:9", server.keys["a_admin"])
    assert text.startswith("UNAVAILABLE: "), text

"""The MCP front with the SDK's own client, over stdio and over streamable HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from jsonschema import Draft7Validator
from mcp import ClientSession, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS
from pydantic import AnyUrl

from shared import VERSION
from tests.e2e.helpers import Server, call, error_text, http_session
from tests.fixtures import samples

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

RAGLINE = str(Path(sys.executable).parent / "ragline")
TOOLS = {
    "list_knowledge_bases",
    "create_knowledge_base",
    "search",
    "get_document_status",
    "ingest",
    "delete_document",
    "list_documents",
    "get_batch_status",
    "read_document",
    "list_sources",
    "add_source",
    "sync_source",
    "remove_source",
}
READ_ONLY = {
    "list_knowledge_bases",
    "search",
    "get_document_status",
    "list_documents",
    "get_batch_status",
    "read_document",
    "list_sources",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@asynccontextmanager
async def stdio_session(tenant: str, **settings: str) -> AsyncIterator[ClientSession]:
    env = {**os.environ, "RAGLINE_TENANT": tenant, **settings}
    params = StdioServerParameters(command=RAGLINE, args=["mcp"], env=env)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        initialized = await session.initialize()
        assert (initialized.serverInfo.name, initialized.serverInfo.version) == ("ragline", VERSION)
        yield session


async def lifecycle(session: ClientSession) -> None:
    """list → create → ingest (text and base64 PDF) → poll → search → read → delete."""
    listed = await session.list_tools()
    tools = {tool.name: tool for tool in listed.tools}
    assert set(tools) >= TOOLS
    for name, tool in tools.items():
        assert tool.inputSchema["type"] == "object"
        assert tool.outputSchema is not None, name
        assert tool.annotations is not None
        assert tool.annotations.readOnlyHint is (name in READ_ONLY), name
    assert tools["search"].inputSchema["properties"]["top_k"]["maximum"] == 100
    for name, tool in tools.items():  # declared, so clients check results with the cheap draft-07 rules
        assert tool.outputSchema is not None
        assert tool.outputSchema["$schema"] == "http://json-schema.org/draft-07/schema#", name
        Draft7Validator.check_schema(tool.outputSchema)

    kb = f"kb-{uuid.uuid4().hex[:6]}"
    await call(session, "create_knowledge_base", kb_id=kb, name="agent notes", description="test")
    assert kb in [k["kb_id"] for k in (await call(session, "list_knowledge_bases"))["knowledge_bases"]]
    text = await call(
        session,
        "ingest",
        kb_id=kb,
        content="The heron nests in the reed beds each spring.",
        filename="heron.txt",
    )
    assert text["outcome"] == "created"
    pdf = samples.text_pdf([["Volcano survey", "Basalt columns formed as the lava cooled slowly."]])
    encoded = base64.b64encode(pdf).decode()
    binary = await call(session, "ingest", kb_id=kb, content_base64=encoded, filename="volcano.pdf")
    seen: set[str] = set()
    for _ in range(600):
        statuses = [
            await call(session, "get_document_status", kb_id=kb, doc_id=d["doc_id"]) for d in (text, binary)
        ]
        seen.update(s["status"] for s in statuses)
        if all(s["status"] == "ready" for s in statuses):
            break
        assert not any(s["status"] == "failed" for s in statuses), statuses
        await anyio.sleep(0.2)
    assert statuses[1]["mime_type"] == "application/pdf"
    print(f"statuses seen while polling: {sorted(seen)}")
    found = await call(session, "search", query="where do herons nest?", kb_ids=[kb], top_k=3)
    # The draft-07 reading of the schema still holds results to their shape.
    search_schema = Draft7Validator(tools["search"].outputSchema or {})
    assert search_schema.is_valid(found)
    assert not search_schema.is_valid({**found, "results": [{**found["results"][0], "chunk_idx": "0"}]})
    assert not search_schema.is_valid({"latency_ms": 1.0})
    # Optional fields are `type: [T, "null"]`: null or T, nothing else.
    assert search_schema.is_valid({**found, "results": [{**found["results"][0], "page_num": None}]})
    assert not search_schema.is_valid({**found, "results": [{**found["results"][0], "page_num": "1"}]})
    hits = found["results"]
    assert hits[0]["doc_id"] == "heron.txt"
    # A field at its default is left out (a text file has no pages); the schema gives the default.
    assert "page_num" not in hits[0]
    assert (tools["search"].outputSchema or {})["$defs"]["Hit"]["properties"]["page_num"]["default"] is None
    assert hits[0]["semantic"]["rank"] is not None
    volcano = (await call(session, "search", query="basalt columns", kb_ids=[kb], mode="keyword"))["results"]
    assert volcano[0]["doc_id"] == binary["doc_id"]
    assert volcano[0]["page_num"] == 1
    around = await call(session, "read_document", kb_id=kb, doc_id="heron.txt", chunk_idx=0, window=1)
    assert "heron" in around["chunks"][0]["text"]
    expected = sorted([text["doc_id"], binary["doc_id"]])
    for _ in range(60):  # the listing is near real time (refreshed each second)
        page = await call(session, "list_documents", kb_id=kb)
        if sorted(d["doc_id"] for d in page["documents"]) == expected:
            break
        await anyio.sleep(1)
    assert sorted(d["doc_id"] for d in page["documents"]) == expected
    await call(session, "get_batch_status", batch_id=text["batch_id"])
    deleted = await call(session, "delete_document", kb_id=kb, doc_id="heron.txt")
    assert deleted["status"] == "deleted"
    after = (await call(session, "search", query="where do herons nest?", kb_ids=[kb]))["results"]
    assert all(h["doc_id"] != "heron.txt" for h in after)


async def test_stdio_lifecycle() -> None:
    async with stdio_session(f"stdio-{secrets.token_hex(4)}") as session:
        await lifecycle(session)


async def test_stdio_on_a_state_dir_no_worker_reads_refuses_uploads(tmp_path: Path) -> None:
    """An MCP client's config without the stack's RAGLINE_STATE_DIR: the bytes would go where no
    worker looks, and each document would fail a minute after it was accepted."""
    state = tmp_path / "another-checkout-state"
    async with stdio_session(f"stdio-{secrets.token_hex(4)}", RAGLINE_STATE_DIR=str(state)) as session:
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        await call(session, "create_knowledge_base", kb_id=kb, name="elsewhere")
        for arguments in ({"content": "A note."}, {"content_base64": base64.b64encode(b"Bytes.").decode()}):
            refused = await session.call_tool("ingest", {"kb_id": kb, **arguments})
            text = error_text(refused)
            assert text.startswith("UNAVAILABLE: "), text
            assert "RAGLINE_STATE_DIR" in text
            assert str(tmp_path) not in text
        assert (await call(session, "list_documents", kb_id=kb))["documents"] == []
    assert not [p for p in (state / "blobstore" / "blobs").rglob("*") if p.is_file()]


async def test_http_lifecycle(server: Server) -> None:
    async with http_session(server, "a_admin") as session:
        await lifecycle(session)
    async with httpx.AsyncClient(base_url=server.url) as client:
        metrics = (await client.get("/metrics")).text
    # MCP traffic has its own route label in the request metrics, not "unmatched".
    assert 'method="POST",route="/mcp",status="200"' in metrics


async def test_ingest_waits_and_reports_progress(server: Server) -> None:
    progress: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        received.append((progress, message))

    received = progress

    async with http_session(server, "a_admin") as session:
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        await call(session, "create_knowledge_base", kb_id=kb, name="waits")
        result = await session.call_tool(
            "ingest",
            {"kb_id": kb, "content": "Otters hold hands while they sleep.", "wait_seconds": 120},
            progress_callback=on_progress,
        )
    assert not result.isError, result.content
    assert result.structuredContent is not None
    assert result.structuredContent["status"] == "ready"
    assert result.structuredContent["document"]["chunk_count"] >= 1
    print(f"progress notifications: {progress}")
    assert len(progress) >= 2
    assert progress[-1] == (1.0, "ready")
    assert [p for p, _ in progress] == sorted(p for p, _ in progress)


async def test_a_call_is_answered_as_json_unless_it_asks_for_progress(server: Server) -> None:
    """A plain call gets one JSON body; a call with a progress token gets an event stream, the
    progress before the answer; and both kinds can be in flight in one session at once."""
    headers = {"X-Api-Key": server.keys["a_admin"], "Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=180) as http:
        hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}}
        opened = await http.post(
            "/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello}
        )
        assert opened.headers["content-type"].startswith("application/json"), opened.headers
        http.headers["Mcp-Session-Id"] = opened.headers["mcp-session-id"]
        http.headers["Mcp-Protocol-Version"] = "2025-06-18"
        (
            await http.post("/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        ).raise_for_status()

        async def rpc(rpc_id: int, tool: str, arguments: dict[str, Any], **meta: str) -> httpx.Response:
            params: dict[str, Any] = {"name": tool, "arguments": arguments}
            if meta:
                params["_meta"] = meta
            message = {"jsonrpc": "2.0", "id": rpc_id, "method": "tools/call", "params": params}
            response = await http.post("/mcp", json=message)
            response.raise_for_status()
            return response

        kb = f"kb-{uuid.uuid4().hex[:6]}"
        created = await rpc(1, "create_knowledge_base", {"kb_id": kb, "name": "answer modes"})
        assert created.headers["content-type"].startswith("application/json")
        assert created.json()["result"]["structuredContent"]["kb_id"] == kb
        arguments = {"kb_id": kb, "content": "Puffins dig burrows on grassy cliffs.", "wait_seconds": 120}
        waiting = asyncio.ensure_future(rpc(2, "ingest", arguments, progressToken="puffin"))
        plain: list[httpx.Response] = []
        while not waiting.done():
            plain.append(await rpc(100 + len(plain), "list_knowledge_bases", {}))
        streamed = waiting.result()
        # A client that takes only JSON gets its answer as JSON, progress or not (not a 406).
        message = {"jsonrpc": "2.0", "id": 3, "method": "tools/call"}
        params = {"name": "list_knowledge_bases", "arguments": {}, "_meta": {"progressToken": "p"}}
        json_only = await http.post(
            "/mcp", json={**message, "params": params}, headers={"Accept": "application/json"}
        )
        assert json_only.status_code == 200, json_only.text
        assert json_only.headers["content-type"].startswith("application/json")
        assert json_only.json()["result"]["structuredContent"]["knowledge_bases"]

    assert len(plain) >= 2, "the plain calls did not overlap the streamed one"
    for i, response in enumerate(plain):
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["id"] == 100 + i
        assert kb in [k["kb_id"] for k in response.json()["result"]["structuredContent"]["knowledge_bases"]]
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = [
        json.loads(line[5:])
        for line in streamed.text.splitlines()
        if line.startswith("data:") and line[5:].strip()
    ]
    *progress, answer = events
    assert answer["id"] == 2
    assert answer["result"]["structuredContent"]["status"] == "ready"
    assert progress, events
    assert all(e["method"] == "notifications/progress" for e in progress), events
    assert {e["params"]["progressToken"] for e in progress} == {"puffin"}
    assert progress[-1]["params"]["progress"] == 1.0


async def test_bad_arguments_are_tool_errors_and_the_session_survives(server: Server) -> None:
    async with http_session(server, "a_admin") as session:
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        await call(session, "create_knowledge_base", kb_id=kb, name="args")
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("search", {"query": ""}, "INVALID_ARGUMENT"),
            ("search", {"query": "x", "top_k": 0}, "INVALID_ARGUMENT"),
            ("search", {"query": "x", "top_k": 1000}, "INVALID_ARGUMENT"),
            ("search", {"query": "x", "kb_ids": ["no-such-kb"]}, "NOT_FOUND"),
            ("ingest", {"kb_id": kb, "content_base64": "%%% not base64"}, "INVALID_ARGUMENT"),
            ("ingest", {"kb_id": kb}, "INVALID_ARGUMENT"),
            ("ingest", {"kb_id": kb, "content": ""}, "INVALID_ARGUMENT"),  # as REST refuses it
            ("ingest", {"kb_id": "no-such-kb", "content": "x"}, "NOT_FOUND"),
            ("get_document_status", {"kb_id": kb, "doc_id": "missing"}, "NOT_FOUND"),
        ]
        for tool, arguments, code in cases:
            result = await session.call_tool(tool, arguments)
            assert error_text(result).startswith(f"{code}: "), (tool, arguments, result.content)
        # still usable
        assert (await call(session, "list_knowledge_bases"))["knowledge_bases"]


async def test_sse_transport_for_older_clients(server: Server) -> None:
    headers = {"X-Api-Key": server.keys["a_read"]}
    async with (
        sse_client(f"{server.url}/mcp/sse", headers=headers) as (read, write),
        ClientSession(read, write) as session,
    ):
        initialized = await session.initialize()
        assert initialized.serverInfo.version == VERSION  # Ragline's, not the SDK's
        names = {tool.name for tool in (await session.list_tools()).tools}
        assert names >= TOOLS
        assert "knowledge_bases" in await call(session, "list_knowledge_bases")
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/mcp/sse")).status_code == 401


async def test_an_unknown_resource_or_prompt_is_a_json_rpc_error_with_its_code(server: Server) -> None:
    """Both reached the client as error code 0, which no client can act on."""
    async with http_session(server, "a_read") as session:
        with pytest.raises(McpError) as resource:
            await session.read_resource(AnyUrl("ragline://kbs/nothing"))
        assert resource.value.error.code == -32002
        with pytest.raises(McpError) as prompt:
            await session.get_prompt("nothing")
        assert prompt.value.error.code == INVALID_PARAMS
        assert (await call(session, "list_knowledge_bases"))["knowledge_bases"] is not None  # still usable


async def test_text_that_reads_as_json_is_ingested_as_text(server: Server) -> None:
    """FastMCP read a `content` that was JSON as an object (refused), `null` as no content, and
    text nested deep raised RecursionError (INTERNAL)."""
    kb = f"kb-{uuid.uuid4().hex[:6]}"
    texts = {
        "config.json": '{"name": "harbour", "port": 8080}',
        "list.json": '["alpha", "beta"]',
        "null.txt": "null",
        "deep.txt": "[" * 3000 + "]" * 3000,
    }
    async with http_session(server, "a_admin") as session:
        await call(session, "create_knowledge_base", kb_id=kb, name="configs")
        for doc_id, content in texts.items():
            ingested = await call(session, "ingest", kb_id=kb, content=content, doc_id=doc_id)
            assert ingested["outcome"] == "created", doc_id
    with server.client("a_admin") as client:
        for doc_id, content in texts.items():
            status = client.get(f"/v1/kbs/{kb}/documents/{doc_id}").json()
            assert status["file_size"] == len(content), (doc_id, status)
        client.delete(f"/v1/kbs/{kb}")


async def test_texts_sent_without_a_name_do_not_replace_each_other(server: Server) -> None:
    """Every text without a doc_id or filename was `content.txt`: each call replaced the last."""
    kb = f"kb-{uuid.uuid4().hex[:6]}"
    async with http_session(server, "a_admin") as session:
        await call(session, "create_knowledge_base", kb_id=kb, name="notes")
        first = await call(session, "ingest", kb_id=kb, content="The first agent note.")
        second = await call(session, "ingest", kb_id=kb, content="The second agent note.")
        again = await call(session, "ingest", kb_id=kb, content="The first agent note.")
    assert (first["outcome"], second["outcome"]) == ("created", "created")
    assert first["doc_id"] != second["doc_id"]
    assert (again["doc_id"], again["outcome"]) == (first["doc_id"], "unchanged")
    with server.client("a_admin") as client:
        for doc_id in (first["doc_id"], second["doc_id"]):
            assert client.get(f"/v1/kbs/{kb}/documents/{doc_id}").status_code == 200
        deadline = time.monotonic() + 30  # the list is near real time
        while (count := len(client.get(f"/v1/kbs/{kb}/documents").json()["documents"])) < 2:
            assert time.monotonic() < deadline, count
            time.sleep(0.5)
        assert count == 2
        client.delete(f"/v1/kbs/{kb}")

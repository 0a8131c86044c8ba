"""Ragline's MCP server (official `mcp` SDK, FastMCP): the same services as REST, for agents.

The tools are module-level functions (`services/mcp/tools.py`); `build_mcp` registers them, and
hands them the services through the server's lifespan context. What the server changes in the
SDK lives in `services/mcp/sdk_patches.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.transport_security import TransportSecuritySettings

from services.core.auth import Principal
from services.core.container import AppState
from services.mcp.sdk_patches import RaglineMCP, low_level_server
from services.mcp.source_tools import SOURCE_TOOLS
from services.mcp.tools import TOOLS, McpServices
from shared import VERSION

INSTRUCTIONS = """Ragline searches the user's knowledge bases (hybrid keyword + semantic retrieval).
1. Call list_knowledge_bases first to learn which knowledge bases exist and what they hold.
2. Call search with the ids you found (kb_ids) and a focused query; each hit names its kb_id,
   doc_id and chunk_idx. Use read_document to widen the context around a hit.
3. After ingest, poll get_document_status until the status is `ready` (or `failed`), or pass
   wait_seconds to ingest to wait for it.
Errors come back as `CODE: message` (NOT_FOUND, INVALID_ARGUMENT, TOO_LARGE, ...)."""


def build_mcp(state: AppState, *, stdio_principal: Principal | None = None) -> RaglineMCP[McpServices]:
    """The MCP server over the given services; `stdio_principal` is the identity of a stdio session."""
    settings = state.settings
    hosts = [h for host in settings.api.allowed_hosts for h in (host, f"{host}:*")]
    origins = [
        f"{scheme}://{h}"
        for host in settings.api.allowed_hosts
        for scheme in ("http", "https")
        for h in (host, f"{host}:*")
    ] + settings.api.allowed_origins
    services = McpServices(state, stdio_principal)

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[McpServices]:
        # Entered by each session the low-level server runs; the services outlive them all.
        yield services

    mcp = RaglineMCP[McpServices](
        name="ragline",
        instructions=INSTRUCTIONS,
        streamable_http_path=settings.mcp.path,
        stateless_http=settings.mcp.stateless,
        session_idle_timeout=None if settings.mcp.stateless else settings.mcp.session_idle_s,
        lifespan=lifespan,
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        ),
    )
    # FastMCP takes no version: unset, clients are told the SDK's own.
    low_level_server(mcp).version = VERSION
    for tool, hints in (*TOOLS, *SOURCE_TOOLS):
        mcp.add_tool(tool, annotations=hints, structured_output=True)
    return mcp

"""Ragline's MCP server (official `mcp` SDK, FastMCP): the same services as REST, for agents.

Domain failures come back as tool results with `isError: true` and the text `CODE: message`
(the REST codes); protocol errors stay protocol errors; no stack trace reaches a client.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
import uuid
from typing import Annotated, Any

import pydantic_core
from mcp.server.fastmcp import Context, FastMCP
from mcp.server.fastmcp.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp.types import CallToolResult, ContentBlock, TextContent, ToolAnnotations
from mcp.types import Tool as MCPTool
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from services.api.auth import Principal, Role, require
from services.api.state import AppState
from services.mcp.outage import outage_message, unreachable
from services.mcp.output_schema import client_schema, structured
from shared.catalog import BatchView, DocumentPage, DocumentStatus, DocumentText, KbView
from shared.errors import ErrorCode, RaglineError
from shared.models import ID_PATTERN, DocStatus
from shared.search.requests import Filters, Mode, SearchRequest, SearchResponse

log = logging.getLogger(__name__)

INSTRUCTIONS = """Ragline searches the user's knowledge bases (hybrid keyword + semantic retrieval).
1. Call list_knowledge_bases first to learn which knowledge bases exist and what they hold.
2. Call search with the ids you found (kb_ids) and a focused query; each hit names its kb_id,
   doc_id and chunk_idx. Use read_document to widen the context around a hit.
3. After ingest, poll get_document_status until the status is `ready` (or `failed`), or pass
   wait_seconds to ingest to wait for it.
Errors come back as `CODE: message` (NOT_FOUND, INVALID_ARGUMENT, TOO_LARGE, ...)."""

READ_ONLY = ToolAnnotations(
    readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False
)
WRITES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
DESTRUCTIVE = ToolAnnotations(
    readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False
)
_POLL_S = 0.5


class KnowledgeBases(BaseModel):
    knowledge_bases: list[KbView]


class IngestResult(BaseModel):
    doc_id: str
    outcome: str
    status: str
    content_version: int
    batch_id: str
    document: DocumentStatus | None = Field(None, description="The final status when wait_seconds was given.")


class RaglineMCP(FastMCP):
    """FastMCP whose tool failures read `CODE: message`, with the codes REST uses."""

    async def list_tools(self) -> list[MCPTool]:
        tools = await super().list_tools()
        for tool in tools:
            if tool.outputSchema is not None:
                tool.outputSchema = client_schema(tool.outputSchema)
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        try:
            # FastMCP.call_tool, without its conversion of the result: it rendered the text copy
            # from the model with an indent and a fallback serializer, a cost on every search.
            result = await self._tool_manager.call_tool(name, arguments, context=self.get_context())
        except ToolError as error:
            return _error_result(error.__cause__ or error)
        if not isinstance(result, BaseModel):  # sent as FastMCP itself would send it
            tool = self._tool_manager.get_tool(name)
            return tool.fn_metadata.convert_result(result) if tool is not None else result
        # Our tools return the model their output schema describes, validated as it was built.
        # The low-level server would check it again against that schema with `jsonschema.validate`,
        # which rebuilds its validator on every call: a finished result goes out as it is. Its
        # text copy (for clients that read only text) is compact JSON, which the client and the
        # model read whole.
        body = structured(result)
        content: list[ContentBlock] = [TextContent(type="text", text=pydantic_core.to_json(body).decode())]
        return CallToolResult(content=content, structuredContent=body, isError=False)


def _error_result(cause: BaseException) -> CallToolResult:
    if isinstance(cause, RaglineError):
        text = f"{cause.code.value}: {cause.message}"
    elif isinstance(cause, ValidationError):
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in cause.errors()[:5]
        )
        text = f"{ErrorCode.INVALID_ARGUMENT.value}: {problems}"
    elif isinstance(cause, ToolError):
        text = f"{ErrorCode.INVALID_ARGUMENT.value}: {cause}"
    elif (down := unreachable(cause)) is not None:
        text = f"{ErrorCode.UNAVAILABLE.value}: {outage_message(down)}"
    else:
        log.error("tool failed: %s", type(cause).__name__, exc_info=cause)
        text = f"{ErrorCode.INTERNAL.value}: internal error"
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    return CallToolResult(content=content, isError=True)


def build_mcp(state: AppState, *, stdio_principal: Principal | None = None) -> RaglineMCP:
    """The MCP server over the given services; `stdio_principal` is the identity of a stdio session."""
    settings = state.settings
    hosts = [h for host in settings.api.allowed_hosts for h in (host, f"{host}:*")]
    origins = [
        f"{scheme}://{h}"
        for host in settings.api.allowed_hosts
        for scheme in ("http", "https")
        for h in (host, f"{host}:*")
    ] + settings.api.allowed_origins
    mcp = RaglineMCP(
        name="ragline",
        instructions=INSTRUCTIONS,
        streamable_http_path="/mcp",
        transport_security=TransportSecuritySettings(
            enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
        ),
    )

    def who(ctx: Context[Any, Any, Any], role: Role) -> Principal:
        request = ctx.request_context.request
        principal: Principal | None = (
            stdio_principal if request is None else getattr(request.state, "principal", None)
        )
        if principal is None:
            raise RaglineError("an API key is required", code=ErrorCode.AUTH_ERROR)
        require(principal, role)
        return principal

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_knowledge_bases(ctx: Context[Any, Any, Any]) -> KnowledgeBases:
        """List the knowledge bases you may search, with their document and chunk counts. Call this first."""
        principal = who(ctx, Role.READ)
        return KnowledgeBases(
            knowledge_bases=await run_in_threadpool(state.catalog.list_kbs, principal.tenant)
        )

    @mcp.tool(annotations=WRITES, structured_output=True)
    async def create_knowledge_base(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(pattern=ID_PATTERN, description="URL-safe id, unique among yours.")],
        name: Annotated[str, Field(min_length=1, max_length=200)],
        description: Annotated[
            str, Field(max_length=4000, description="What it holds (helps later searches).")
        ] = "",
        tags: Annotated[list[str] | None, Field(max_length=50)] = None,
    ) -> KbView:
        """Create a knowledge base to ingest documents into (PII is redacted by default)."""
        principal = who(ctx, Role.WRITE)
        return await run_in_threadpool(
            state.catalog.create_kb, principal.tenant, kb_id, name, description, tags
        )

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def search(
        ctx: Context[Any, Any, Any],
        query: Annotated[str, Field(min_length=1, max_length=4000, description="What to look for.")],
        kb_ids: Annotated[
            list[str] | None, Field(description="Knowledge bases to search; default: all yours.")
        ] = None,
        top_k: Annotated[int, Field(ge=1, le=100, description="How many hits to return.")] = 10,
        mode: Annotated[Mode, Field(description="hybrid (default), similarity or keyword.")] = Mode.HYBRID,
        min_score: Annotated[
            float | None, Field(ge=0, le=1, description="Similarity mode: lowest score.")
        ] = None,
        filters: Annotated[
            Filters | None, Field(description="metadata, mime_types, source_prefix, doc_ids.")
        ] = None,
        max_per_document: Annotated[
            int | None, Field(ge=1, le=100, description="Most hits per document.")
        ] = None,
    ) -> SearchResponse:
        """Hybrid (keyword + semantic) search; each hit has its text, score, source and position."""
        principal = who(ctx, Role.READ)
        request = SearchRequest(
            query=query,
            kb_ids=kb_ids,
            top_k=top_k,
            mode=mode,
            min_score=min_score,
            filters=filters,
            max_per_document=max_per_document,
        )
        return await run_in_threadpool(state.search, principal.tenant, request)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def get_document_status(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(min_length=1, max_length=128)],
        doc_id: Annotated[str, Field(min_length=1, max_length=200)],
    ) -> DocumentStatus:
        """A document's processing status: queued → parsing → … → ready, or failed with its error."""
        principal = who(ctx, Role.READ)
        return await run_in_threadpool(state.catalog.document_status, principal.tenant, kb_id, doc_id)

    @mcp.tool(annotations=WRITES, structured_output=True)
    async def ingest(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(min_length=1, max_length=128)],
        content: Annotated[str | None, Field(description="The document as text.")] = None,
        content_base64: Annotated[
            str | None, Field(description="The file's bytes, base64 (PDF, DOCX, ...).")
        ] = None,
        filename: Annotated[
            str | None, Field(max_length=255, description="Helps tell Markdown and CSV.")
        ] = None,
        mime_type: Annotated[str | None, Field(max_length=200)] = None,
        doc_id: Annotated[
            str | None, Field(min_length=1, max_length=200, description="Default: from filename.")
        ] = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="Filterable metadata.")] = None,
        wait_seconds: Annotated[
            float, Field(ge=0, le=600, description="Wait up to this long for ready.")
        ] = 0,
    ) -> IngestResult:
        """Add or update one document. Poll get_document_status afterwards, or set wait_seconds."""
        principal = who(ctx, Role.WRITE)
        data = _payload(content, content_base64, settings.api.max_file_bytes)
        batch_id = uuid.uuid4().hex
        result = await run_in_threadpool(
            state.ingestor.submit,
            principal.tenant,
            kb_id,
            data,
            filename=filename or ("content.txt" if content else None),
            mime_type=mime_type,
            doc_id=doc_id,
            metadata=metadata or {},
            batch_id=batch_id,
            priority="interactive",  # an agent's document: admission keeps it within the tenant's quota
        )
        final = None
        if wait_seconds > 0:
            final = await _wait(ctx, state, principal.tenant, kb_id, result.doc_id, wait_seconds)
        return IngestResult(
            doc_id=result.doc_id,
            outcome=result.outcome,
            status=final.status if final else result.status,
            content_version=result.content_version,
            batch_id=batch_id,
            document=final,
        )

    @mcp.tool(annotations=DESTRUCTIVE, structured_output=True)
    async def delete_document(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(min_length=1, max_length=128)],
        doc_id: Annotated[str, Field(min_length=1, max_length=200)],
    ) -> DocumentStatus:
        """Delete a document: it disappears from search at once."""
        principal = who(ctx, Role.WRITE)
        await run_in_threadpool(state.registry.get_kb, principal.tenant, kb_id)
        await run_in_threadpool(state.ingestor.delete, principal.tenant, kb_id, doc_id)
        return await run_in_threadpool(state.catalog.document_status, principal.tenant, kb_id, doc_id)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def list_documents(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(min_length=1, max_length=128)],
        status: Annotated[DocStatus | None, Field(description="Only documents in this status.")] = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 50,
        cursor: Annotated[
            str | None, Field(max_length=2000, description="next_cursor of the previous page.")
        ] = None,
    ) -> DocumentPage:
        """The documents of a knowledge base, in doc_id order, a page at a time."""
        principal = who(ctx, Role.READ)
        return await run_in_threadpool(
            state.catalog.list_documents, principal.tenant, kb_id, status, limit, cursor
        )

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def get_batch_status(
        ctx: Context[Any, Any, Any], batch_id: Annotated[str, Field(min_length=1, max_length=100)]
    ) -> BatchView:
        """Progress of a batch of uploads: counts per status and every failure."""
        principal = who(ctx, Role.READ)
        return await run_in_threadpool(state.catalog.batch, principal.tenant, batch_id)

    @mcp.tool(annotations=READ_ONLY, structured_output=True)
    async def read_document(
        ctx: Context[Any, Any, Any],
        kb_id: Annotated[str, Field(min_length=1, max_length=128)],
        doc_id: Annotated[str, Field(min_length=1, max_length=200)],
        chunk_idx: Annotated[
            int | None, Field(ge=0, description="Centre on this chunk (from a hit).")
        ] = None,
        window: Annotated[int, Field(ge=0, le=20, description="Neighbours on each side.")] = 2,
    ) -> DocumentText:
        """Read a chunk and its neighbours, or the document's chunks in order, to widen a hit's context."""
        principal = who(ctx, Role.READ)
        return await run_in_threadpool(
            state.catalog.read_chunks, principal.tenant, kb_id, doc_id, chunk_idx, window
        )

    return mcp


def _payload(content: str | None, content_base64: str | None, limit: int) -> bytes:
    if (content is None) == (content_base64 is None):
        raise RaglineError("give exactly one of content or content_base64", code=ErrorCode.INVALID_ARGUMENT)
    if content is not None:
        data = content.encode()
    else:
        try:
            data = base64.b64decode(content_base64 or "", validate=True)
        except (binascii.Error, ValueError):
            raise RaglineError(
                "content_base64 is not valid base64", code=ErrorCode.INVALID_ARGUMENT
            ) from None
    if len(data) > limit:
        raise RaglineError(f"the document exceeds the limit of {limit} bytes", code=ErrorCode.TOO_LARGE)
    return data


async def _wait(
    ctx: Context[Any, Any, Any], state: AppState, tenant: str, kb_id: str, doc_id: str, seconds: float
) -> DocumentStatus:
    """Poll until ready/failed or the time is up, reporting each new stage as MCP progress."""
    deadline = time.monotonic() + seconds
    last = None
    while True:
        status = await run_in_threadpool(state.catalog.document_status, tenant, kb_id, doc_id)
        if status.status != last:
            last = status.status
            await ctx.report_progress(status.progress, 1.0, message=status.status)
        if status.status in ("ready", "failed") or time.monotonic() >= deadline:
            return status
        await asyncio.sleep(_POLL_S)

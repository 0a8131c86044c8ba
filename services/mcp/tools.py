"""Ragline's MCP tools: one module-level function per tool, its docstring the description.

Each tool takes the call's `Context` (FastMCP injects it) and reaches the services through
`services(ctx)`, the server's lifespan context (`server.McpServices`); the caller's identity
comes from `caller`. `TOOLS` lists them in the order `tools/list` answers, with their
annotations; `server.build_mcp` registers them, in one place.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
import uuid
from dataclasses import dataclass, replace
from typing import Annotated, Any

from mcp.server.fastmcp import Context
from mcp.server.session import ServerSession
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from services.core.auth import Principal, Role, require
from services.core.container import AppState
from shared.catalog import BatchView, DocumentPage, DocumentStatus, DocumentText, KbView
from shared.errors import ErrorCode, RaglineError
from shared.ingest import Upload, text_filename
from shared.models import ID_PATTERN, DocStatus, KbSettings
from shared.search.fusion import Fusion
from shared.search.requests import Filters, Mode, SearchRequest, SearchResponse

READ_ONLY = ToolAnnotations(
    readOnlyHint=True, destructiveHint=False, idempotentHint=True, openWorldHint=False
)
WRITES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
DESTRUCTIVE = ToolAnnotations(
    readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=False
)
_POLL_S = 0.5


@dataclass(frozen=True)
class McpServices:
    """What every tool call of one server reaches: the services, and a stdio session's identity."""

    state: AppState
    stdio_principal: Principal | None = None


# What FastMCP injects into a tool: the session, this server's lifespan context, the HTTP request
# (None over stdio).
ToolContext = Context[ServerSession, McpServices, Request]


def services(ctx: ToolContext) -> McpServices:
    """The services of the server answering this call (its lifespan context)."""
    return ctx.request_context.lifespan_context


def caller(ctx: ToolContext, role: Role) -> Principal:
    """Who calls (the key of the HTTP request, or the stdio identity), checked for `role`."""
    request = ctx.request_context.request
    principal: Principal | None = (
        services(ctx).stdio_principal if request is None else getattr(request.state, "principal", None)
    )
    if principal is None:
        raise RaglineError("an API key is required", code=ErrorCode.AUTH_ERROR)
    require(principal, role)
    return principal


class KnowledgeBases(BaseModel):
    knowledge_bases: list[KbView]


class IngestResult(BaseModel):
    doc_id: str
    outcome: str
    status: str
    content_version: int
    batch_id: str
    document: DocumentStatus | None = Field(None, description="The final status when wait_seconds was given.")


async def list_knowledge_bases(ctx: ToolContext) -> KnowledgeBases:
    """List the knowledge bases you may search, with their document and chunk counts. Call this first."""
    principal = caller(ctx, Role.READ)
    state = services(ctx).state
    return KnowledgeBases(knowledge_bases=await run_in_threadpool(state.catalog.list_kbs, principal.tenant))


async def create_knowledge_base(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(pattern=ID_PATTERN, description="URL-safe id, unique among yours.")],
    name: Annotated[str, Field(min_length=1, max_length=200)],
    description: Annotated[
        str, Field(max_length=4000, description="What it holds (helps later searches).")
    ] = "",
    tags: Annotated[list[str] | None, Field(max_length=50)] = None,
    settings: Annotated[
        KbSettings | None,
        Field(description="chunk_size, chunk_overlap, pii_policy (redact, mask, hash, block, off), language"),
    ] = None,
) -> KbView:
    """Create a knowledge base to ingest documents into (PII is redacted by default)."""
    principal = caller(ctx, Role.WRITE)
    state = services(ctx).state
    return await run_in_threadpool(
        state.catalog.create_kb, principal.tenant, kb_id, name, description, tags, settings
    )


async def search(
    ctx: ToolContext,
    query: Annotated[str, Field(min_length=1, max_length=4000, description="What to look for.")],
    kb_ids: Annotated[
        list[str] | None, Field(description="Knowledge bases to search; default: all yours.")
    ] = None,
    top_k: Annotated[int, Field(ge=1, le=100, description="How many hits to return.")] = 10,
    mode: Annotated[Mode, Field(description="hybrid (default), similarity or keyword.")] = Mode.HYBRID,
    fusion: Annotated[
        Fusion, Field(description="Hybrid: how the arms' scores combine (min_max, rrf or z_score).")
    ] = Fusion.MIN_MAX,
    weights: Annotated[
        dict[str, float] | None,
        Field(
            description="Hybrid: weights of the arms keyword, semantic, document_keyword and "
            "document_semantic; an arm not named weighs 0. Default: all equal."
        ),
    ] = None,
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
    principal = caller(ctx, Role.READ)
    request = SearchRequest(
        query=query,
        kb_ids=kb_ids,
        top_k=top_k,
        mode=mode,
        fusion=fusion,
        weights=weights,
        min_score=min_score,
        filters=filters,
        max_per_document=max_per_document,
    )
    return await run_in_threadpool(services(ctx).state.search, principal.tenant, request)


async def get_document_status(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(min_length=1, max_length=128)],
    doc_id: Annotated[str, Field(min_length=1, max_length=200)],
) -> DocumentStatus:
    """A document's processing status: queued → parsing → … → ready, or failed with its error."""
    principal = caller(ctx, Role.READ)
    state = services(ctx).state
    return await run_in_threadpool(state.catalog.document_status, principal.tenant, kb_id, doc_id)


async def ingest(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(min_length=1, max_length=128)],
    content: Annotated[str | None, Field(min_length=1, description="The document as text.")] = None,
    content_base64: Annotated[
        str | None, Field(description="The file's bytes, base64 (PDF, DOCX, ...).")
    ] = None,
    url: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=2048,
            description="An http(s) URL the server fetches the document from (public addresses only).",
        ),
    ] = None,
    filename: Annotated[str | None, Field(max_length=255, description="Helps tell Markdown and CSV.")] = None,
    mime_type: Annotated[str | None, Field(max_length=200)] = None,
    doc_id: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=200,
            description="Default: from filename or URL, else from the content (the same text, the same id).",
        ),
    ] = None,
    metadata: Annotated[dict[str, Any] | None, Field(description="Filterable metadata.")] = None,
    wait_seconds: Annotated[float, Field(ge=0, le=600, description="Wait up to this long for ready.")] = 0,
) -> IngestResult:
    """Add or update a document (text, base64 or URL). Poll get_document_status, or set wait_seconds."""
    principal = caller(ctx, Role.WRITE)
    state = services(ctx).state
    upload = _upload(content, content_base64, url, state.settings.api.max_file_bytes)
    if url is None:
        named = filename or (text_filename(doc_id) if content is not None else None)
        upload = replace(upload, filename=named, mime_type=mime_type)
    elif filename is not None or mime_type is not None:
        raise RaglineError(
            "filename and mime_type come from the URL's answer; leave them out",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    batch_id = uuid.uuid4().hex
    (result,) = await run_in_threadpool(
        state.ingestor.submit_many,
        principal.tenant,
        kb_id,
        [replace(upload, doc_id=doc_id)],
        metadata=metadata or {},
        batch_id=batch_id,
    )
    final = None
    if wait_seconds > 0:
        final = await _wait(ctx, state, principal.tenant, kb_id, result.doc_id, wait_seconds)
    # A URL fetched again may find the bytes it had: the version then ends `unchanged`.
    outcome = final.outcome if final is not None and final.outcome else result.outcome
    return IngestResult(
        doc_id=result.doc_id,
        outcome=outcome,
        status=final.status if final else result.status,
        content_version=result.content_version,
        batch_id=batch_id,
        document=final,
    )


async def delete_document(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(min_length=1, max_length=128)],
    doc_id: Annotated[str, Field(min_length=1, max_length=200)],
) -> DocumentStatus:
    """Delete a document: it disappears from search at once."""
    principal = caller(ctx, Role.WRITE)
    state = services(ctx).state
    await run_in_threadpool(state.registry.get_kb, principal.tenant, kb_id)
    await run_in_threadpool(state.ingestor.delete, principal.tenant, kb_id, doc_id)
    return await run_in_threadpool(state.catalog.document_status, principal.tenant, kb_id, doc_id)


async def list_documents(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(min_length=1, max_length=128)],
    status: Annotated[DocStatus | None, Field(description="Only documents in this status.")] = None,
    limit: Annotated[int, Field(ge=1, le=1000)] = 50,
    cursor: Annotated[
        str | None, Field(max_length=2000, description="next_cursor of the previous page.")
    ] = None,
) -> DocumentPage:
    """The documents of a knowledge base, in doc_id order, a page at a time."""
    principal = caller(ctx, Role.READ)
    state = services(ctx).state
    return await run_in_threadpool(
        state.catalog.list_documents, principal.tenant, kb_id, status, limit, cursor
    )


async def get_batch_status(
    ctx: ToolContext, batch_id: Annotated[str, Field(min_length=1, max_length=100)]
) -> BatchView:
    """Progress of a batch of uploads: counts per status and every failure."""
    principal = caller(ctx, Role.READ)
    return await run_in_threadpool(services(ctx).state.catalog.batch, principal.tenant, batch_id)


async def read_document(
    ctx: ToolContext,
    kb_id: Annotated[str, Field(min_length=1, max_length=128)],
    doc_id: Annotated[str, Field(min_length=1, max_length=200)],
    chunk_idx: Annotated[int | None, Field(ge=0, description="Centre on this chunk (from a hit).")] = None,
    window: Annotated[int, Field(ge=0, le=20, description="Neighbours on each side.")] = 2,
) -> DocumentText:
    """Read a chunk and its neighbours, or the document's chunks in order, to widen a hit's context."""
    principal = caller(ctx, Role.READ)
    state = services(ctx).state
    return await run_in_threadpool(
        state.catalog.read_chunks, principal.tenant, kb_id, doc_id, chunk_idx, window
    )


# The tools in the order `tools/list` answers, each with its annotations.
TOOLS: tuple[tuple[Any, ToolAnnotations], ...] = (
    (list_knowledge_bases, READ_ONLY),
    (create_knowledge_base, WRITES),
    (search, READ_ONLY),
    (get_document_status, READ_ONLY),
    (ingest, WRITES),
    (delete_document, DESTRUCTIVE),
    (list_documents, READ_ONLY),
    (get_batch_status, READ_ONLY),
    (read_document, READ_ONLY),
)


def _upload(content: str | None, content_base64: str | None, url: str | None, limit: int) -> Upload:
    if sum(given is not None for given in (content, content_base64, url)) != 1:
        raise RaglineError(
            "give exactly one of content, content_base64 and url", code=ErrorCode.INVALID_ARGUMENT
        )
    if url is not None:
        return Upload.of_url(url)
    return Upload(_payload(content, content_base64, limit))


def _payload(content: str | None, content_base64: str | None, limit: int) -> bytes:
    if content is not None:
        try:
            data = content.encode()
        except UnicodeEncodeError:  # a lone surrogate (`\ud800`), which JSON lets through
            raise RaglineError(
                "content is not valid Unicode (a lone surrogate); send such bytes as content_base64",
                code=ErrorCode.INVALID_ARGUMENT,
            ) from None
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
    ctx: ToolContext, state: AppState, tenant: str, kb_id: str, doc_id: str, seconds: float
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

"""MCP tools for sources: what `POST/GET/PATCH/DELETE /v1/kbs/{kb_id}/sources` and `.../sync` do, for agents.

`add_source` takes the same body as the REST route (one of the four types with its settings), and
`sync_source` can wait for the run, reporting its progress as it lists the source.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Annotated

from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from services.core.auth import Role
from services.mcp.tools import DESTRUCTIVE, READ_ONLY, ToolContext, caller, services
from shared.sources.models import SOURCE_ID_PATTERN, SourceChange, SourceSpec, SyncRun
from shared.sources.service import SourceView

# A source reaches outside Ragline (a bucket, a site, a repository); a sync writes and deletes documents.
ADDS = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False, openWorldHint=True)
SYNCS = ToolAnnotations(readOnlyHint=False, destructiveHint=True, idempotentHint=True, openWorldHint=True)
# A change of schedule or deletion guard touches no document itself.
UPDATES = ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=True, openWorldHint=False)
_POLL_S = 1.0
KbId = Annotated[str, Field(min_length=1, max_length=128)]
SourceId = Annotated[str, Field(pattern=SOURCE_ID_PATTERN)]


class SourceList(BaseModel):
    sources: list[SourceView]


async def list_sources(ctx: ToolContext, kb_id: KbId) -> SourceList:
    """The sources of a knowledge base (folder, s3, web, git) and how their last run ended."""
    principal = caller(ctx, Role.READ)
    found = await run_in_threadpool(services(ctx).state.sources.of_kb, principal.tenant, kb_id)
    return SourceList(sources=found)


async def add_source(
    ctx: ToolContext,
    kb_id: KbId,
    source: Annotated[
        SourceSpec,
        Field(description="type (folder, s3, web, git) and its settings: {type: web, settings: {url: ...}}."),
    ],
) -> SourceView:
    """Add a source whose documents the knowledge base keeps in sync; then call sync_source."""
    principal = caller(ctx, Role.ADMIN)
    return await run_in_threadpool(services(ctx).state.sources.add, principal.tenant, kb_id, source)


async def sync_source(
    ctx: ToolContext,
    kb_id: KbId,
    source_id: SourceId,
    wait_seconds: Annotated[
        float, Field(ge=0, le=600, description="Wait up to this long for the run to end.")
    ] = 0,
    allow_deletions: Annotated[
        bool, Field(description="Delete past the source's max_deleted_share, this run only.")
    ] = False,
    retry_failed: Annotated[
        bool, Field(description="Ingest again the documents the pipeline failed, their bytes unchanged.")
    ] = False,
) -> SyncRun:
    """Sync a source now (or join the run under way): new and changed items are ingested, vanished
    ones deleted. The run reports counts per outcome and each failure with its code; one that would
    delete more than the source's max_deleted_share fails with CONFLICT and deletes nothing. The
    documents it sent go through the pipeline after it ends: get_batch_status(batch_id=run_id)
    follows them, failures included (later runs count a failed document failed until its bytes
    change, it is reingested, or a run with retry_failed ingests it again)."""
    principal = caller(ctx, Role.WRITE)
    state = services(ctx).state
    run = await run_in_threadpool(
        partial(state.sources.sync, allow_deletions=allow_deletions, retry_failed=retry_failed),
        principal.tenant,
        kb_id,
        source_id,
    )
    deadline = time.monotonic() + wait_seconds
    listed = -1
    while run.status.active and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_S)
        run = await run_in_threadpool(state.sources.run, principal.tenant, kb_id, source_id, run.run_id)
        if run.listed != listed:
            listed = run.listed
            await ctx.report_progress(listed, None, message=f"{run.status.value}: {listed} items listed")
    return run


async def update_source(
    ctx: ToolContext,
    kb_id: KbId,
    source_id: SourceId,
    change: Annotated[
        SourceChange,
        Field(
            description="The fields to change, the others left out: name, schedule ({interval_s: N}, or "
            "null for runs only when asked), max_deleted_share."
        ),
    ],
) -> SourceView:
    """Change a source's name, schedule or max_deleted_share; what it reads stays as it was."""
    principal = caller(ctx, Role.ADMIN)
    return await run_in_threadpool(
        services(ctx).state.sources.update, principal.tenant, kb_id, source_id, change
    )


async def remove_source(
    ctx: ToolContext,
    kb_id: KbId,
    source_id: SourceId,
    keep_documents: Annotated[bool, Field(description="Keep the documents it brought.")] = False,
) -> SourceView:
    """Remove a source; its documents are deleted with it unless keep_documents."""
    principal = caller(ctx, Role.ADMIN)
    state = services(ctx).state
    before = await run_in_threadpool(state.sources.get, principal.tenant, kb_id, source_id)
    await run_in_threadpool(
        lambda: state.sources.remove(principal.tenant, kb_id, source_id, keep_documents=keep_documents)
    )
    return before.model_copy(update={"deleting": not keep_documents})


SOURCE_TOOLS = (
    (list_sources, READ_ONLY),
    (add_source, ADDS),
    (sync_source, SYNCS),
    (update_source, UPDATES),
    (remove_source, DESTRUCTIVE),
)

"""Sources of a knowledge base: add, list, read, change, remove, sync, and their runs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Query, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from services.api.deps import Admin, Reader, State, Writer
from shared.sources.models import SourceChange, SourceSpec, SyncRun
from shared.sources.service import SourceView

router = APIRouter(prefix="/v1/kbs/{kb_id}/sources", tags=["sources"])


class SourceList(BaseModel):
    sources: list[SourceView]


class RunList(BaseModel):
    runs: list[SyncRun]


@router.post("", status_code=201, response_model=SourceView)
def add_source(kb_id: str, body: Annotated[SourceSpec, Body()], state: State, who: Admin) -> SourceView:
    """Add a source (folder, s3, web or git) to the knowledge base; `schedule` makes it sync by
    itself, else `POST .../sync` starts a run."""
    return state.sources.add(who.tenant, kb_id, body)


@router.get("", response_model=SourceList)
def list_sources(kb_id: str, state: State, who: Reader) -> SourceList:
    return SourceList(sources=state.sources.of_kb(who.tenant, kb_id))


@router.get("/{source_id}", response_model=SourceView)
def get_source(kb_id: str, source_id: str, state: State, who: Reader) -> SourceView:
    return state.sources.get(who.tenant, kb_id, source_id)


@router.patch("/{source_id}", response_model=SourceView)
def update_source(
    kb_id: str, source_id: str, body: Annotated[SourceChange, Body()], state: State, who: Admin
) -> SourceView:
    """Change a source's name, schedule (null: only when asked) or max_deleted_share; fields left
    out stay as they are. What it reads is fixed: another place is another source."""
    return state.sources.update(who.tenant, kb_id, source_id, body)


@router.delete("/{source_id}", status_code=202, response_model=None)
def remove_source(
    kb_id: str,
    source_id: str,
    state: State,
    who: Admin,
    keep_documents: Annotated[
        bool, Query(description="Keep the documents it brought (they stay as uploads would).")
    ] = False,
) -> Response:
    """Remove the source: a run deletes its documents, then the source (202 with that run); with
    `keep_documents` it is forgotten at once (204)."""
    run = state.sources.remove(who.tenant, kb_id, source_id, keep_documents=keep_documents)
    if run is None:
        return Response(status_code=204)
    return JSONResponse(status_code=202, content=run.model_dump(mode="json"))


@router.post("/{source_id}/sync", status_code=202, response_model=SyncRun)
def sync_source(
    kb_id: str,
    source_id: str,
    state: State,
    who: Writer,
    allow_deletions: Annotated[
        bool, Query(description="Delete past the source's max_deleted_share, this run only.")
    ] = False,
    retry_failed: Annotated[
        bool, Query(description="Ingest again the documents the pipeline failed, their bytes unchanged.")
    ] = False,
) -> SyncRun:
    """Start a run (or answer the one queued or running: one at a time); poll it at `.../runs/{run_id}`."""
    return state.sources.sync(
        who.tenant, kb_id, source_id, allow_deletions=allow_deletions, retry_failed=retry_failed
    )


@router.get("/{source_id}/runs", response_model=RunList)
def list_runs(
    kb_id: str,
    source_id: str,
    state: State,
    who: Reader,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> RunList:
    return RunList(runs=state.sources.runs(who.tenant, kb_id, source_id, limit))


@router.get("/{source_id}/runs/{run_id}", response_model=SyncRun)
def get_run(kb_id: str, source_id: str, run_id: str, state: State, who: Reader) -> SyncRun:
    return state.sources.run(who.tenant, kb_id, source_id, run_id)

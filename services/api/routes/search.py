"""Hybrid search over the caller's knowledge bases."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from services.api.deps import Reader, State
from shared.search.hybrid import SearchRequest, SearchResponse

router = APIRouter(tags=["search"])


@router.post("/v1/search", response_model=SearchResponse)
async def search(body: SearchRequest, state: State, who: Reader) -> SearchResponse:
    kb_ids = await run_in_threadpool(state.catalog.readable_kb_ids, who.tenant, body.kb_ids)
    return await run_in_threadpool(state.searcher.search, who.tenant, kb_ids, body)

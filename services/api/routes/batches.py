"""Batches: the progress of one upload request (or a CLI load) as a whole."""

from __future__ import annotations

from fastapi import APIRouter

from services.api.deps import Reader, State
from shared.catalog import BatchView

router = APIRouter(tags=["batches"])


@router.get("/v1/batches/{batch_id}", response_model=BatchView)
def get_batch(batch_id: str, state: State, who: Reader) -> BatchView:
    return state.catalog.batch(who.tenant, batch_id)

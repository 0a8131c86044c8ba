"""A document's chunks: a hit's neighbours, or the document's chunks in order (MCP `read_document`).

The document is a query parameter, not a path segment: ids may hold `/` and end in any word, so
`/documents/{doc_id}/chunks` could not be told from a document whose id ends in `/chunks`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from services.api.deps import Reader, State
from shared.catalog import DocumentText

router = APIRouter(prefix="/v1/kbs/{kb_id}/chunks", tags=["documents"])


@router.get("", response_model=DocumentText)
def read_chunks(
    kb_id: str,
    state: State,
    who: Reader,
    doc_id: Annotated[str, Query(min_length=1, max_length=200)],
    chunk_idx: Annotated[int | None, Query(ge=0, description="Centre on this chunk (from a hit).")] = None,
    window: Annotated[int, Query(ge=0, le=20, description="Neighbours on each side.")] = 2,
) -> DocumentText:
    """Read a chunk and its neighbours, or the document's chunks in order, to widen a hit's context."""
    return state.catalog.read_chunks(who.tenant, kb_id, doc_id, chunk_idx, window)

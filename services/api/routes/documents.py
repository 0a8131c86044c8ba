"""Documents: upload (multipart files or inline JSON content), list, status, delete, re-ingest."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from services.api.deps import Reader, State, Writer
from services.api.upload_body import OPENAPI_BODY, read_upload
from shared.catalog import DocumentPage, document_view
from shared.ingest import SubmitResult
from shared.models import DocStatus

router = APIRouter(prefix="/v1/kbs/{kb_id}/documents", tags=["documents"])


class Accepted(BaseModel):
    doc_id: str
    outcome: str
    status: str
    content_version: int
    filename: str | None = None

    @classmethod
    def of(cls, result: SubmitResult, filename: str | None = None) -> Accepted:
        return cls(
            doc_id=result.doc_id,
            outcome=result.outcome,
            status=result.status,
            content_version=result.content_version,
            filename=filename,
        )


class UploadResponse(BaseModel):
    batch_id: str
    documents: list[Accepted]


@router.post("", status_code=202, response_model=UploadResponse, openapi_extra={"requestBody": OPENAPI_BODY})
async def upload(kb_id: str, request: Request, state: State, who: Writer) -> UploadResponse:
    """Accept one or more files (multipart field `files`), inline `content` (JSON), or a `url` the
    worker fetches (JSON)."""
    await run_in_threadpool(state.registry.get_kb, who.tenant, kb_id)
    async with read_upload(request) as body:
        results = await run_in_threadpool(
            state.ingestor.submit_many,
            who.tenant,
            kb_id,
            body.uploads,
            metadata=body.metadata,
            batch_id=body.batch_id,
            priority=body.priority,
        )
    return UploadResponse(
        batch_id=body.batch_id,
        documents=[Accepted.of(r, name) for r, name in zip(results, body.names, strict=True)],
    )


@router.get("", response_model=DocumentPage)
def list_documents(
    kb_id: str,
    state: State,
    who: Reader,
    status: DocStatus | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    cursor: Annotated[str | None, Query(max_length=2000)] = None,
) -> DocumentPage:
    return state.catalog.list_documents(who.tenant, kb_id, status, limit, cursor)


@router.post("/{doc_id:path}/reingest", status_code=202, response_model=Accepted)
def reingest(kb_id: str, doc_id: str, state: State, who: Writer) -> Accepted:
    state.registry.get_kb(who.tenant, kb_id)
    return Accepted.of(state.ingestor.reingest(who.tenant, kb_id, doc_id))


@router.get("/{doc_id:path}")
def get_document(kb_id: str, doc_id: str, state: State, who: Reader) -> dict[str, Any]:
    return state.catalog.get_document(who.tenant, kb_id, doc_id)


@router.delete("/{doc_id:path}")
def delete_document(kb_id: str, doc_id: str, state: State, who: Writer) -> dict[str, Any]:
    state.registry.get_kb(who.tenant, kb_id)
    return document_view(state.ingestor.delete(who.tenant, kb_id, doc_id))

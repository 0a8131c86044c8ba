"""Documents: upload (multipart files or inline JSON content), list, status, delete, re-ingest."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from services.api.deps import Reader, State, Writer
from shared.catalog import DocumentPage, document_view
from shared.errors import ErrorCode, RaglineError
from shared.ingest import Upload
from shared.models import DocStatus

router = APIRouter(prefix="/v1/kbs/{kb_id}/documents", tags=["documents"])

_READ_CHUNK = 1 << 20
_MAX_FILES = 1000


class InlineDocument(BaseModel):
    """A document given as text in a JSON body."""

    model_config = {"extra": "forbid"}
    content: str = Field(min_length=1)
    filename: str | None = Field(None, max_length=500)
    doc_id: str | None = Field(None, min_length=1, max_length=200)
    mime_type: str | None = Field(None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    batch_id: str | None = Field(None, min_length=1, max_length=100)
    priority: Literal["interactive", "bulk"] | None = Field(
        None, description="Ask for the interactive queue, or opt out of it; admission decides."
    )


# The route reads the body itself (JSON or a streamed multipart form), so FastAPI cannot infer it:
# describe both shapes for /docs, clients and the schema-driven fuzzer.
_UPLOAD_BODY = {
    "required": True,
    "content": {
        "application/json": {"schema": InlineDocument.model_json_schema()},
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["files"],
                "properties": {
                    "files": {"type": "array", "items": {"type": "string", "format": "binary"}},
                    "doc_id": {"type": "string", "description": "Only with a single file."},
                    "metadata": {"type": "string", "description": "A JSON object."},
                    "batch_id": {"type": "string"},
                    "priority": {"type": "string", "enum": ["interactive", "bulk"]},
                },
            }
        },
    },
}


class Accepted(BaseModel):
    doc_id: str
    outcome: str
    status: str
    content_version: int
    filename: str | None = None


class UploadResponse(BaseModel):
    batch_id: str
    documents: list[Accepted]


def is_json_upload(content_type: str) -> bool:
    """Whether an upload's body is the JSON form: the route parses it whole, so its limit is smaller."""
    return content_type.startswith("application/json")


def _inline(body: bytes) -> InlineDocument:
    try:
        return InlineDocument.model_validate_json(body)
    except ValidationError as error:
        problems = [{"field": ".".join(map(str, e["loc"])), "problem": e["msg"]} for e in error.errors()]
        raise RaglineError(
            "the request is not valid", code=ErrorCode.INVALID_ARGUMENT, details={"errors": problems}
        ) from None


def _metadata(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise RaglineError("metadata must be a JSON object", code=ErrorCode.INVALID_ARGUMENT) from None
    if not isinstance(value, dict):
        raise RaglineError("metadata must be a JSON object", code=ErrorCode.INVALID_ARGUMENT)
    return value


def _chunks(upload: UploadFile) -> Iterator[bytes]:
    upload.file.seek(0)
    while part := upload.file.read(_READ_CHUNK):
        yield part


def _clean_name(name: str) -> str:
    """The file name without directories or control characters: a label, never a path."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = "".join(c for c in base if c.isprintable()).strip(" .")
    return cleaned[:255] or "upload"


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) and value != "" else None


@router.post("", status_code=202, response_model=UploadResponse, openapi_extra={"requestBody": _UPLOAD_BODY})
async def upload(kb_id: str, request: Request, state: State, who: Writer) -> UploadResponse:
    """Accept one or more files (multipart field `files`) or inline `content` (JSON).

    The route only reads what the caller sent and asked for: sizes, ids, queues and bounds are the
    ingestor's (shared/ingest.py, shared/admission.py), the same for every front.
    """
    await run_in_threadpool(state.registry.get_kb, who.tenant, kb_id)
    content_type = request.headers.get("content-type", "")
    if is_json_upload(content_type):
        # The body's size is bounded as it streams (services/api/app.py); parsing it takes long
        # for a big one, so it runs beside the event loop, which keeps serving other requests.
        body = await run_in_threadpool(_inline, await request.body())
        batch_id = body.batch_id or uuid.uuid4().hex
        result = await run_in_threadpool(
            state.ingestor.submit,
            who.tenant,
            kb_id,
            body.content.encode(),
            filename=body.filename or "content.txt",
            mime_type=body.mime_type,
            doc_id=body.doc_id,
            metadata=body.metadata,
            batch_id=batch_id,
            priority=body.priority,
        )
        return UploadResponse(
            batch_id=batch_id,
            documents=[
                Accepted(
                    doc_id=result.doc_id,
                    outcome=result.outcome,
                    status=result.status,
                    content_version=result.content_version,
                    filename=body.filename,
                )
            ],
        )
    if not content_type.startswith("multipart/form-data"):
        raise RaglineError(
            "send multipart/form-data with `files`, or JSON with `content`",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )
    form = await request.form(max_files=_MAX_FILES, max_fields=50)
    try:
        files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
        if not files:
            raise RaglineError(
                "no files: send them in the multipart field `files`", code=ErrorCode.INVALID_ARGUMENT
            )
        doc_id = _field(form, "doc_id")
        if doc_id is not None and len(files) > 1:
            raise RaglineError("doc_id can only be given with a single file", code=ErrorCode.INVALID_ARGUMENT)
        metadata = _metadata(_field(form, "metadata"))
        batch_id = _field(form, "batch_id") or uuid.uuid4().hex
        names = [_clean_name(f.filename or "upload") for f in files]
        uploads = [
            Upload(_chunks(f), filename=name, mime_type=f.content_type, doc_id=doc_id, size=f.size)
            for f, name in zip(files, names, strict=True)
        ]
        results = await run_in_threadpool(
            state.ingestor.submit_many,
            who.tenant,
            kb_id,
            uploads,
            metadata=metadata,
            batch_id=batch_id,
            priority=_field(form, "priority"),
        )
        accepted = [
            Accepted(
                doc_id=result.doc_id,
                outcome=result.outcome,
                status=result.status,
                content_version=result.content_version,
                filename=name,
            )
            for result, name in zip(results, names, strict=True)
        ]
        return UploadResponse(batch_id=batch_id, documents=accepted)
    finally:
        await form.close()


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
    result = state.ingestor.reingest(who.tenant, kb_id, doc_id)
    return Accepted(
        doc_id=result.doc_id,
        outcome=result.outcome,
        status=result.status,
        content_version=result.content_version,
    )


@router.get("/{doc_id:path}")
def get_document(kb_id: str, doc_id: str, state: State, who: Reader) -> dict[str, Any]:
    return state.catalog.get_document(who.tenant, kb_id, doc_id)


@router.delete("/{doc_id:path}")
def delete_document(kb_id: str, doc_id: str, state: State, who: Writer) -> dict[str, Any]:
    state.registry.get_kb(who.tenant, kb_id)
    return document_view(state.ingestor.delete(who.tenant, kb_id, doc_id))

"""What an upload request carries, read from its body: one inline document (or a URL to fetch) as
JSON, or files in a streamed multipart form. Reading is all the REST front does with an upload;
sizes, ids, URL checks, queues and bounds are the ingestor's (shared/ingest.py,
shared/admission.py), the same for every front."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import Request
from pydantic import BaseModel, Field, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from shared.errors import ErrorCode, RaglineError
from shared.ingest import Upload, text_filename
from shared.models import file_label, repeated_ids, safe_doc_id

_READ_CHUNK = 1 << 20
_MAX_FILES = 1000


class InlineDocument(BaseModel):
    """A document given as text in a JSON body, or as a URL the worker fetches it from."""

    model_config = {"extra": "forbid"}
    content: str | None = Field(None, min_length=1, description="The document as text (or give `url`).")
    url: str | None = Field(
        None,
        min_length=1,
        max_length=2048,
        description="An http(s) URL the worker fetches the document from, instead of `content`; "
        "addresses that are not public are refused (FETCH_REFUSED). The doc_id defaults to the "
        "URL's host and path; filename and mime_type come from the answer.",
    )
    filename: str | None = Field(None, max_length=500)
    doc_id: str | None = Field(None, min_length=1, max_length=200)
    mime_type: str | None = Field(None, max_length=200)
    metadata: dict[str, Any] = Field(default_factory=dict)
    batch_id: str | None = Field(None, min_length=1, max_length=100)
    priority: Literal["interactive", "bulk"] | None = Field(
        None, description="Ask for the interactive queue, or opt out of it; admission decides."
    )

    @model_validator(mode="after")
    def _content_or_url(self) -> InlineDocument:
        if (self.content is None) == (self.url is None):
            raise ValueError("give exactly one of content and url")
        if self.url is not None and (self.filename is not None or self.mime_type is not None):
            raise ValueError("filename and mime_type come from the URL's answer; leave them out")
        return self


# The route reads the body itself (JSON or a streamed multipart form), so FastAPI cannot infer it:
# describe both shapes for /docs, clients and the schema-driven fuzzer.
OPENAPI_BODY = {
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


@dataclass(frozen=True)
class UploadBody:
    """The documents of one request and what the caller said of all of them."""

    uploads: list[Upload]
    names: list[str | None]  # as the response echoes them
    metadata: dict[str, Any]
    batch_id: str
    priority: str | None


def is_json_upload(content_type: str) -> bool:
    """Whether an upload's body is the JSON form: the route parses it whole, so its limit is smaller."""
    return content_type.startswith("application/json")


@asynccontextmanager
async def read_upload(request: Request) -> AsyncIterator[UploadBody]:
    """The request's documents, valid for the `async with` block (a form's spooled files close after)."""
    content_type = request.headers.get("content-type", "")
    if is_json_upload(content_type):
        yield await _read_json(request)
        return
    if not content_type.startswith("multipart/form-data"):
        raise RaglineError(
            "send multipart/form-data with `files`, or JSON with `content` or `url`",
            code=ErrorCode.UNSUPPORTED_MEDIA_TYPE,
        )
    form = await request.form(max_files=_MAX_FILES, max_fields=50)
    try:
        yield _from_form(form)
    finally:
        await form.close()


async def _read_json(request: Request) -> UploadBody:
    # The body's size is bounded as it streams (services/api/app.py); parsing it takes long for a
    # big one, so it runs beside the event loop, which keeps serving other requests.
    body = await run_in_threadpool(_inline, await request.body())
    if body.url is not None:
        upload = Upload.of_url(body.url, doc_id=body.doc_id)
    else:
        upload = Upload(
            (body.content or "").encode(),
            filename=body.filename or text_filename(body.doc_id),
            mime_type=body.mime_type,
            doc_id=body.doc_id,
        )
    return UploadBody(
        uploads=[upload],
        names=[file_label(body.filename) if body.filename else None],
        metadata=body.metadata,
        batch_id=body.batch_id or uuid.uuid4().hex,
        priority=body.priority,
    )


def _from_form(form: Any) -> UploadBody:
    files = [f for f in form.getlist("files") if isinstance(f, UploadFile)]
    if not files:
        raise RaglineError(
            "no files: send them in the multipart field `files`", code=ErrorCode.INVALID_ARGUMENT
        )
    doc_id = _field(form, "doc_id")
    if doc_id is not None and len(files) > 1:
        raise RaglineError("doc_id can only be given with a single file", code=ErrorCode.INVALID_ARGUMENT)
    names = [file_label(f.filename or "upload") for f in files]
    if doc_id is None:
        _one_file_a_document(names)
    uploads = [
        Upload(_chunks(f), filename=name, mime_type=f.content_type, doc_id=doc_id, size=f.size)
        for f, name in zip(files, names, strict=True)
    ]
    return UploadBody(
        uploads=uploads,
        names=list(names),
        metadata=_metadata(_field(form, "metadata")),
        batch_id=_field(form, "batch_id") or uuid.uuid4().hex,
        priority=_field(form, "priority"),
    )


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


def _one_file_a_document(names: list[str]) -> None:
    """Refuse a form of files whose names give one document id ("a b.txt", "a-b.txt")."""
    repeated = repeated_ids([safe_doc_id(name) for name in names])
    if repeated:
        earlier, later = repeated[0]
        raise RaglineError(
            f"files {earlier} and {later} of the form give the same document id: rename one, "
            "or send them apart, each with a doc_id",
            code=ErrorCode.INVALID_ARGUMENT,
            details={"field": "files", "files": [earlier, later]},
        )


def _field(form: Any, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) and value != "" else None

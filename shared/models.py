"""The records Ragline stores and returns: knowledge bases, documents and their status."""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from enum import StrEnum
from itertools import groupby
from typing import Any

from pydantic import BaseModel, Field, model_validator

from shared.errors import ErrorCode, RaglineError

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._~-]{0,127}$"
DOC_ID_MAX_CHARS = 200
# The registry key is "<tenant>/<kb>/<doc_id>" and OpenSearch ids hold 512 bytes: tenant ids are at
# most 63 characters and KB ids 128, which leaves this much for the document id.
DOC_ID_MAX_BYTES = 300
# Control characters (C0, DEL, C1), line and paragraph separators, and the bidirectional marks,
# embeddings, overrides and isolates: in a log line, a listing or a terminal they make an id read as
# another one. Lone surrogates cannot be stored at all.
_DOC_ID_FORBIDDEN = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def utcnow() -> datetime:
    return datetime.now(UTC)


class DocStatus(StrEnum):
    """Lifecycle of a document (docs/architecture.md#registry-and-status)."""

    QUEUED = "queued"
    FETCHING = "fetching"
    PARSING = "parsing"
    CHUNKING = "chunking"
    ENRICHING = "enriching"
    REDACTING = "redacting"
    EMBEDDING = "embedding"
    INDEXING = "indexing"
    READY = "ready"
    FAILED = "failed"
    DELETING = "deleting"
    DELETED = "deleted"

    @property
    def terminal(self) -> bool:
        return self in (DocStatus.READY, DocStatus.FAILED, DocStatus.DELETED)


class Stage(StrEnum):
    """Pipeline stages, in order. Each has one module in workers/stages/.

    A version starts at fetch when its bytes are still at a URL (ingest by URL), else at parse.
    """

    FETCH = "fetch"
    PARSE = "parse"
    CHUNK = "chunk"
    ENRICH = "enrich"
    PII = "pii"
    EMBED = "embed"
    STORE = "store"


PIPELINE: tuple[Stage, ...] = tuple(Stage)
# The stages a version can start at, which it waits for as `queued`: fetch (a URL), parse (bytes).
ENTRY_STAGES = frozenset({Stage.FETCH, Stage.PARSE})
STAGE_STATUS: dict[Stage, DocStatus] = {
    Stage.FETCH: DocStatus.FETCHING,
    Stage.PARSE: DocStatus.PARSING,
    Stage.CHUNK: DocStatus.CHUNKING,
    Stage.ENRICH: DocStatus.ENRICHING,
    Stage.PII: DocStatus.REDACTING,
    Stage.EMBED: DocStatus.EMBEDDING,
    Stage.STORE: DocStatus.INDEXING,
}


class Outcome(StrEnum):
    """What a submit did (and, on a document, what its current version brought)."""

    CREATED = "created"
    UNCHANGED = "unchanged"
    UPDATED = "updated"


class PiiPolicy(StrEnum):
    REDACT = "redact"
    MASK = "mask"
    HASH = "hash"
    BLOCK = "block"
    OFF = "off"


DEFAULT_PII_ENTITIES = [
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "PERSON",
    "IBAN_CODE",
    "IP_ADDRESS",
    "US_SSN",
]
# The entities the worker's analyzer can report (workers/stages/pii.py): the pattern recognizers'
# and those the spaCy model's NER labels map to. Presidio also lists entities of NER labels this
# model never emits (EMAIL, ID, AGE), and ignores a name it does not know: either would turn
# redaction off without a word. Kept here because the API does not load Presidio; a unit test
# checks it against the real analyzer.
SUPPORTED_PII_ENTITIES = (
    "CREDIT_CARD",
    "CRYPTO",
    "DATE_TIME",
    "EMAIL_ADDRESS",
    "IBAN_CODE",
    "IP_ADDRESS",
    "LOCATION",
    "MAC_ADDRESS",
    "MEDICAL_LICENSE",
    "NRP",
    "ORGANIZATION",
    "PERSON",
    "PHONE_NUMBER",
    "UK_NHS",
    "URL",
    "US_BANK_NUMBER",
    "US_DRIVER_LICENSE",
    "US_ITIN",
    "US_PASSPORT",
    "US_SSN",
    "UUID",
)


def check_pii_entities(entities: list[str]) -> None:
    """INVALID_ARGUMENT naming the entities the analyzer cannot find, with the ones it can."""
    unknown = sorted(set(entities) - set(SUPPORTED_PII_ENTITIES))
    if unknown:
        raise RaglineError(
            f"unknown PII entities {unknown}; supported: {list(SUPPORTED_PII_ENTITIES)}",
            code=ErrorCode.INVALID_ARGUMENT,
            details={"unknown": unknown, "supported": list(SUPPORTED_PII_ENTITIES)},
        )


def check_pii_settings(policy: PiiPolicy, entities: list[str]) -> None:
    """`check_pii_entities`, and INVALID_ARGUMENT for no entities under a policy other than `off`:
    nothing would be detected, so a KB set to redact (or block) would silently keep its PII."""
    check_pii_entities(entities)
    if not entities and policy != PiiPolicy.OFF:
        raise RaglineError(
            f"pii_entities is empty under pii_policy {policy.value!r}: nothing would be detected; "
            "name the entities, or set pii_policy to 'off'",
            code=ErrorCode.INVALID_ARGUMENT,
            details={"field": "pii_entities"},
        )


class KbSettings(BaseModel):
    """Per-knowledge-base processing settings."""

    model_config = {"extra": "forbid"}

    chunk_size: int = Field(256, ge=32, le=256, description="Chunk length in model tokens, header included.")
    chunk_overlap: int = Field(32, ge=0, le=128, description="Tokens shared by consecutive chunks.")
    pii_policy: PiiPolicy = Field(PiiPolicy.REDACT, description="What to do with detected personal data.")
    pii_entities: list[str] = Field(default_factory=lambda: list(DEFAULT_PII_ENTITIES))
    language: str = Field("en", pattern=r"^[a-z]{2}$", description="Main language of the documents.")

    @model_validator(mode="after")
    def _overlap_below_size(self) -> KbSettings:
        # After the model, not on the field: a default overlap with a small chunk_size counts too
        # (a stored KB that breaks this rule could no longer be read back).
        if self.chunk_overlap >= self.chunk_size // 2:
            raise ValueError(f"chunk_overlap must be less than half of chunk_size ({self.chunk_size})")
        return self


class Reembed(BaseModel):
    """A running `reembed`: the model the KB's chunks are being moved to."""

    model: str
    started_at: datetime = Field(default_factory=utcnow)


class KnowledgeBase(BaseModel):
    tenant_id: str
    kb_id: str = Field(pattern=ID_PATTERN)
    name: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=4000)
    tags: list[str] = Field(default_factory=list)
    settings: KbSettings = Field(default_factory=KbSettings)
    embedding_model: str = "all-MiniLM-L6-v2"
    embedding_dimension: int = 384
    reembed: Reembed | None = None
    reembed_error: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class FetchInfo(BaseModel):
    """What the fetch stage learned of a document's URL: where redirects ended, what the server
    declared, and the validators that let the next fetch ask "changed since?" (for these bytes)."""

    final_url: str
    content_type: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    content_hash: str  # the bytes the validators describe


class ErrorInfo(BaseModel):
    code: str
    stage: str | None = None
    message: str
    retryable: bool = False


class Document(BaseModel):
    """One registry entry per (tenant, kb, doc_id): the document's status and provenance."""

    tenant_id: str
    kb_id: str
    doc_id: str
    status: DocStatus = DocStatus.QUEUED
    stage: Stage | None = None
    progress: float = 0.0
    attempts: int = 0
    error: ErrorInfo | None = None
    content_hash: str
    content_version: int = 1
    active_generation: int | None = None
    file_size: int
    mime_type: str | None = None
    filename: str | None = None
    source_uri: str | None = None
    source_id: str | None = None  # the source that brought it (shared/sources), if one did
    # Ingest by URL: the worker fetches each version's bytes from here (`content_hash` is empty
    # until the first fetch); `fetch` is what the last fetch found.
    url: str | None = None
    fetch: FetchInfo | None = None
    outcome: Outcome | None = None  # what the current version brought; None on older records
    title: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    chunk_count: int = 0
    pii: dict[str, int] = Field(default_factory=dict)
    # The trace context of the request that accepted this version, so that a stage the
    # reconciler sends again still belongs to that request's trace.
    trace: dict[str, str] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)
    stats: dict[str, dict[str, int]] = Field(default_factory=dict)
    transitions: list[dict[str, Any]] = Field(default_factory=list)
    queue: str = "bulk"
    batch_id: str | None = None
    claimed_by: str | None = None
    lease_until: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


def entry_stage(doc: Document) -> Stage:
    """The stage a queued version waits for: fetch when its bytes are still at its URL, else parse."""
    return Stage.FETCH if doc.stage == Stage.FETCH else Stage.PARSE


def file_label(name: str) -> str:
    """A caller's file name without directories or unprintable characters (NUL, controls, the
    bidirectional marks): a label, never a path, kept as the document's filename."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = "".join(c for c in base if c.isprintable()).strip(" .")
    return cleaned[:255] or "upload"


def repeated_ids(doc_ids: list[str]) -> list[tuple[int, int]]:
    """(first position, later position) of each id that repeats an earlier one: in one request or
    one load, the later document would replace the earlier, both answered as accepted."""
    first: dict[str, int] = {}
    return [(first[d], n) for n, d in enumerate(doc_ids) if first.setdefault(d, n) != n]


def safe_doc_id(raw: str) -> str:
    """A document id derived from a file name or path: stable, at most DOC_ID_MAX_CHARS characters
    and DOC_ID_MAX_BYTES bytes, letters and digits of any script kept (NFC), every other character
    but `._~/-` a "-": names in Japanese or Cyrillic stay apart (an ASCII-only rule made
    `日本.txt` and `отчёт.txt` both `txt`, the second upload replacing the first).

    Empty, "." and ".." segments are dropped: in the id's URL they would point somewhere else.
    """
    normalized = unicodedata.normalize("NFC", raw.strip().replace("\\", "/"))
    # A run of other characters becomes one "-".
    cleaned = "".join("".join(run) if kept else "-" for kept, run in groupby(normalized, _kept))
    segments = [segment for segment in cleaned.split("/") if segment not in ("", ".", "..")]
    doc_id = "/".join(segments).strip("-/.")[:DOC_ID_MAX_CHARS]
    while len(doc_id.encode()) > DOC_ID_MAX_BYTES:
        doc_id = doc_id[:-1]
    return doc_id.rstrip("-/.") or "document"


def _kept(char: str) -> bool:
    """A letter, mark or digit of any script (a mark: the vowel signs of Indic scripts), or `._~/-`."""
    return char in "._~/-" or unicodedata.category(char)[0] in "LMN"


def check_doc_id(doc_id: str) -> str:
    """An explicit document id as given, or INVALID_ARGUMENT: the one rule of every front.

    Refused: control and bidirectional-formatting characters, leading or trailing whitespace
    (a whitespace-only id too), a leading "/", empty, "." and ".."
    segments (in the id's URL they would address something else), and ids too long for the
    registry key. The message never repeats the id: it is caller content.
    """
    problem = None
    if not doc_id:
        problem = "is empty"
    elif _DOC_ID_FORBIDDEN.search(doc_id):
        problem = "holds a control or bidirectional-formatting character"
    elif doc_id != doc_id.strip():
        problem = "starts or ends with whitespace (or is only whitespace)"
    elif len(doc_id) > DOC_ID_MAX_CHARS or len(doc_id.encode()) > DOC_ID_MAX_BYTES:
        problem = f"is longer than {DOC_ID_MAX_CHARS} characters or {DOC_ID_MAX_BYTES} UTF-8 bytes"
    elif {"", ".", ".."} & set(doc_id.replace("\\", "/").split("/")):
        problem = 'has an empty, "." or ".." path segment (or starts or ends with "/")'
    if problem is not None:
        raise RaglineError(f"doc_id {problem}", code=ErrorCode.INVALID_ARGUMENT, details={"field": "doc_id"})
    return doc_id

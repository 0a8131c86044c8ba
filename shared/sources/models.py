"""What a source is (its type and settings), what a sync run reports, and what a source remembers of
each item it listed: the records of the sources store (shared/sources/store.py).

A source belongs to one knowledge base. Its items become documents whose `source_id` names it and
whose `source_uri` links back to the original; a run lists the source, submits what is new or
changed, and deletes the documents of items that disappeared.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from shared.models import ID_PATTERN, ErrorInfo, utcnow

SOURCE_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
MAX_FAILURES_KEPT = 100


class SourceType(StrEnum):
    FOLDER = "folder"
    S3 = "s3"
    WEB = "web"
    GIT = "git"


class _Settings(BaseModel):
    model_config = {"extra": "forbid"}


def _patterns(value: list[str]) -> list[str]:
    for pattern in value:
        if not pattern or pattern.startswith("/") or "\x00" in pattern or len(pattern) > 500:
            raise ValueError("a pattern is a relative glob such as 'docs/**/*.md'")
    return value


def _no_nul(value: str | None) -> str | None:
    # No path, object key or URL holds one; a NUL passed on failed the run INTERNAL in the worker.
    if value is not None and "\x00" in value:
        raise ValueError("must not contain a NUL character")
    return value


class FolderSettings(_Settings):
    path: str = Field(
        min_length=1,
        max_length=4096,
        description="A directory the workers read, inside one of RAGLINE_SOURCES__FOLDER_ROOTS.",
    )
    include: list[str] = Field(
        default_factory=lambda: ["**/*"], max_length=50, description="Globs of the files to take."
    )
    exclude: list[str] = Field(
        default_factory=lambda: [".git/**", "**/.*"],
        max_length=50,
        description="Globs of the files to leave.",
    )

    _check = field_validator("include", "exclude")(_patterns)
    _text = field_validator("path")(_no_nul)


class S3Settings(_Settings):
    bucket: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
    prefix: str = Field("", max_length=1024, description="Only keys under this prefix.")
    endpoint_url: str | None = Field(
        None,
        max_length=2048,
        description="An S3-compatible server; default: RAGLINE_SOURCES__S3_ENDPOINT_URL.",
    )
    region: str | None = Field(None, pattern=r"^[a-z0-9-]{1,40}$")
    access_key_id: str | None = Field(None, max_length=256)
    secret_access_key: SecretStr | None = Field(
        None, description="Kept with the source and never shown again; default: the settings' credentials."
    )
    include: list[str] = Field(default_factory=lambda: ["**/*"], max_length=50)
    exclude: list[str] = Field(default_factory=list, max_length=50)

    _check = field_validator("include", "exclude")(_patterns)
    _text = field_validator("prefix", "endpoint_url", "access_key_id")(_no_nul)

    @model_validator(mode="after")
    def _both_or_neither(self) -> S3Settings:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("give both access_key_id and secret_access_key, or neither")
        return self


class WebSettings(_Settings):
    url: str = Field(
        max_length=2048, description="A start page, or a sitemap (sitemap.xml, or a sitemap index)."
    )
    prefix: str | None = Field(
        None,
        max_length=2048,
        description="Only URLs under this prefix are taken and followed; default: the start URL's directory.",
    )
    max_pages: int = Field(5000, ge=1, le=100_000, description="Most pages a run takes.")
    max_depth: int = Field(20, ge=0, le=100, description="Most links followed from the start page.")

    @field_validator("url", "prefix")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return _no_nul(value)


class GitSettings(_Settings):
    url: str = Field(
        max_length=2048,
        description="A repository: an https://, http:// or git:// URL, or a path inside a folder root.",
    )
    ref: str = Field(
        "HEAD", pattern=r"^[A-Za-z0-9._/-]{1,200}$", description="Branch, tag or commit; default: HEAD."
    )
    include: list[str] = Field(default_factory=lambda: ["**/*"], max_length=50)
    exclude: list[str] = Field(default_factory=list, max_length=50)

    _check = field_validator("include", "exclude")(_patterns)
    _text = field_validator("url")(_no_nul)

    @field_validator("ref")
    @classmethod
    def _not_an_option(cls, value: str) -> str:
        if value.startswith("-") or ".." in value:
            raise ValueError("not a ref name")
        return value


class Schedule(_Settings):
    interval_s: int = Field(ge=60, le=30 * 86400, description="Seconds between runs.")


DeletedShare = Annotated[
    float,
    Field(
        ge=0.0,
        le=1.0,
        strict=True,  # a JSON `true` read as 1.0 would turn the check off
        description="A run that would delete more than this share of the source's documents (and more "
        "than one) fails with CONFLICT and deletes nothing: a site mid-deploy, an unmounted folder or a "
        "robots.txt typo lists little. Later runs are held too, until one deletes at most one document "
        "or a sync with allow_deletions lets one run through. 1 turns the check off.",
    ),
]


class _SourceSpec(BaseModel):
    model_config = {"extra": "forbid"}

    source_id: str | None = Field(None, pattern=SOURCE_ID_PATTERN, description="Default: generated.")
    name: str = Field("", max_length=200)
    schedule: Schedule | None = Field(None, description="Run by itself this often; none: only when asked.")
    doc_id_prefix: str = Field(
        "",
        max_length=100,
        pattern=r"^([A-Za-z0-9._~-]+/)*$",
        description="Put before each item's id (e.g. 'wiki/'), so that two sources of one KB never "
        "name the same document.",
    )
    max_deleted_share: DeletedShare = 0.5


class FolderSpec(_SourceSpec):
    type: Literal[SourceType.FOLDER]
    settings: FolderSettings


class S3Spec(_SourceSpec):
    type: Literal[SourceType.S3]
    settings: S3Settings


class WebSpec(_SourceSpec):
    type: Literal[SourceType.WEB]
    settings: WebSettings


class GitSpec(_SourceSpec):
    type: Literal[SourceType.GIT]
    settings: GitSettings


SourceSpec = Annotated[FolderSpec | S3Spec | WebSpec | GitSpec, Field(discriminator="type")]


def _no_defaults(schema: dict[str, Any]) -> None:
    # A client that fills in defaults would send `schedule: null`, which stops the schedule.
    for field in schema.get("properties", {}).values():
        field.pop("default", None)


class SourceChange(BaseModel):
    """What may change of a source once added: the fields given, the others as they were. What it
    reads (its type and settings) stays: another place is another source."""

    model_config = {"extra": "forbid", "json_schema_extra": _no_defaults}

    name: str | None = Field(None, max_length=200)
    schedule: Schedule | None = Field(
        None, description="Run by itself this often; null: only when asked. Omitted: unchanged."
    )
    max_deleted_share: DeletedShare | None = None


class RunStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    # Went through its listing, and items of it failed: their documents stay as they were.
    COMPLETED_WITH_ERRORS = "completed_with_errors"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def active(self) -> bool:
        return self in (RunStatus.QUEUED, RunStatus.RUNNING)

    @property
    def completed(self) -> bool:
        """Went through its listing: what it found is what the source holds now."""
        return self in (RunStatus.SUCCEEDED, RunStatus.COMPLETED_WITH_ERRORS)


class ItemOutcome(StrEnum):
    """What a run did with one item of the source."""

    CREATED = "created"
    UPDATED = "updated"
    UNCHANGED = "unchanged"
    DELETED = "deleted"
    FAILED = "failed"


class ItemFailure(BaseModel):
    key: str
    code: str
    message: str


Trigger = Literal["manual", "schedule", "remove"]


class SyncRun(BaseModel):
    """One run of a source: queued, then running (resumed by another worker if its own died), then
    ended with counts per outcome, the failures with their codes, and its duration."""

    run_id: str
    tenant_id: str
    kb_id: str
    source_id: str
    status: RunStatus = RunStatus.QUEUED
    trigger: Trigger = "manual"
    allow_deletions: bool = False  # past the source's max_deleted_share, this run only
    retry_failed: bool = False  # ingest again, from their stored bytes, the documents that failed
    attempts: int = 0
    claimed_by: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    listed: int = 0
    failures: list[ItemFailure] = Field(default_factory=list)
    error: ErrorInfo | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    duration_s: float | None = None


class Source(BaseModel):
    """A source as stored: its spec, and what runs left on it."""

    tenant_id: str
    kb_id: str = Field(pattern=ID_PATTERN)
    source_id: str = Field(pattern=SOURCE_ID_PATTERN)
    type: SourceType
    name: str = ""
    settings: dict[str, Any]
    schedule: Schedule | None = None
    doc_id_prefix: str = ""
    max_deleted_share: float = 0.5
    # Set by a run refused for what it would delete: the next runs are refused too (see sync.py).
    deletions_held: bool = False
    deleting: bool = False
    # What an incremental type carries from one run to the next (git: the commit last synced).
    cursor: dict[str, Any] = Field(default_factory=dict)
    last_run: SyncRun | None = None
    next_run_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class ItemState(BaseModel):
    """What the source remembers of one item: the document it became, the version it had, the run
    that last saw it, and what that run did (so a resumed run skips what it already did)."""

    key: str
    doc_id: str
    version: str | None = None
    run_id: str
    outcome: ItemOutcome
    error: ItemFailure | None = None
    # Type-specific memory (web: ETag, Last-Modified and the page's links, for a 304).
    extra: dict[str, Any] = Field(default_factory=dict)

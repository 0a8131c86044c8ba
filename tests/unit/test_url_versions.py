"""What a URL ingested again keeps of its document: the baseline its fetch compares with, or none."""

from __future__ import annotations

from typing import Any

import pytest

from shared.ingest import url_version
from shared.models import DocStatus, Document, ErrorInfo, FetchInfo, Outcome, Stage

URL = "https://docs.example.com/guide.md"
HELD = "ab" * 32
FETCHED = FetchInfo(
    final_url=URL, etag='"e1"', last_modified="Mon, 01 Jan 2024 00:00:00 GMT", content_hash=HELD
)


def _previous(status: DocStatus, **fields: Any) -> Document:
    base: dict[str, Any] = {
        "tenant_id": "t",
        "kb_id": "kb",
        "doc_id": "guide",
        "status": status,
        "content_hash": HELD,
        "file_size": 40,
        "content_version": 3,
        "active_generation": 3,
        "chunk_count": 5,
        "url": URL,
        "fetch": FETCHED,
        "metadata": {"team": "docs"},
        "attempts": 2,
        "transitions": [{"status": "ready", "at": "x"}],
    }
    return Document.model_validate({**base, **fields})


def _new(
    previous: Document | None, url: str = URL, metadata: dict[str, Any] | None = None
) -> tuple[Document, str | None]:
    return url_version(previous, "t", "kb", "guide", url, metadata or {})


def test_a_first_version_waits_for_its_fetch_with_no_bytes() -> None:
    doc, released = _new(None, metadata={"team": "docs"})
    assert released is None
    assert (doc.status, doc.stage, doc.content_version, doc.outcome) == (
        DocStatus.QUEUED,
        Stage.FETCH,
        1,
        Outcome.CREATED,
    )
    assert (doc.content_hash, doc.file_size, doc.fetch, doc.active_generation) == ("", 0, None, None)
    assert (doc.url, doc.source_uri, doc.filename, doc.metadata) == (URL, URL, "guide.md", {"team": "docs"})


@pytest.mark.parametrize(
    ("status", "outcome"), [(DocStatus.DELETED, Outcome.CREATED), (DocStatus.DELETING, Outcome.UPDATED)]
)
def test_a_deleted_document_starts_again_after_its_last_version(status: DocStatus, outcome: Outcome) -> None:
    doc, released = _new(_previous(status))
    assert released is None
    assert (doc.content_version, doc.outcome, doc.content_hash, doc.active_generation) == (
        4,
        outcome,
        "",
        None,
    )
    assert doc.metadata == {}


def test_a_ready_document_keeps_its_bytes_validators_and_chunks_as_the_baseline() -> None:
    previous = _previous(DocStatus.READY)
    doc, released = _new(previous)
    assert released is None
    assert (doc.content_hash, doc.file_size, doc.fetch) == (HELD, 40, FETCHED)
    assert (doc.active_generation, doc.chunk_count) == (3, 5)  # readers keep the ready version
    assert (doc.status, doc.stage, doc.content_version, doc.outcome) == (
        DocStatus.QUEUED,
        Stage.FETCH,
        4,
        Outcome.UPDATED,
    )
    assert (doc.attempts, doc.error, doc.claimed_by, doc.progress) == (0, None, None, 0.0)
    assert doc.metadata == {"team": "docs"}  # not given: kept
    assert previous.content_version == 3  # the record read is left as it was


def test_the_same_metadata_again_keeps_the_baseline_and_new_metadata_drops_it() -> None:
    same, released = _new(_previous(DocStatus.READY), metadata={"team": "docs"})
    assert (same.content_hash, released) == (HELD, None)
    other, released = _new(_previous(DocStatus.READY), metadata={"team": "ops"})
    assert (other.content_hash, other.fetch, other.metadata, released) == ("", None, {"team": "ops"}, HELD)


def test_another_url_keeps_the_bytes_but_not_their_validators() -> None:
    doc, released = _new(_previous(DocStatus.READY), url="https://docs.example.com/v2/guide.md")
    assert (doc.content_hash, doc.fetch, released) == (HELD, None, None)
    assert doc.url == doc.source_uri == "https://docs.example.com/v2/guide.md"


@pytest.mark.parametrize(
    "status",
    [
        DocStatus.FAILED,
        DocStatus.QUEUED,
        DocStatus.FETCHING,
        DocStatus.PARSING,
        DocStatus.EMBEDDING,
        DocStatus.INDEXING,
    ],
)
def test_any_other_state_leaves_no_baseline_and_releases_its_bytes(status: DocStatus) -> None:
    # A failed or unfinished version's bytes never became the chunks readers see.
    error = ErrorInfo(code="PARSE_ERROR", stage="parse", message="x") if status == DocStatus.FAILED else None
    doc, released = _new(_previous(status, error=error))
    assert released == HELD
    assert (doc.content_hash, doc.file_size, doc.fetch, doc.error) == ("", 0, None, None)
    assert (doc.active_generation, doc.chunk_count) == (3, 5)


def test_a_version_never_fetched_has_nothing_to_release() -> None:
    doc, released = _new(_previous(DocStatus.FAILED, content_hash="", fetch=None))
    assert (doc.content_hash, released) == ("", None)

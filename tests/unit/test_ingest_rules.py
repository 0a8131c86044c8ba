"""When a submit is `unchanged` (no work) and when the pipeline runs again."""

from __future__ import annotations

import pytest

from shared.ingest import _unchanged
from shared.models import DocStatus, Document, ErrorInfo

SHA = "a" * 64


def _doc(status: DocStatus, code: str | None = None, metadata: dict[str, str] | None = None) -> Document:
    error = ErrorInfo(code=code, stage="parse", message="m") if code else None
    return Document(
        tenant_id="t",
        kb_id="k",
        doc_id="d",
        content_hash=SHA,
        file_size=1,
        status=status,
        error=error,
        metadata=metadata or {},
    )


@pytest.mark.parametrize(
    ("doc", "sha", "unchanged"),
    [
        (_doc(DocStatus.READY), SHA, True),
        (_doc(DocStatus.EMBEDDING), SHA, True),
        (_doc(DocStatus.READY), "b" * 64, False),
        (_doc(DocStatus.DELETED), SHA, False),
        (_doc(DocStatus.FAILED, "PARSE_ERROR"), SHA, True),
        (_doc(DocStatus.FAILED, "UNSUPPORTED_MEDIA_TYPE"), SHA, True),
        (_doc(DocStatus.FAILED, "RETRIES_EXHAUSTED"), SHA, False),
        (_doc(DocStatus.FAILED, "TIMEOUT"), SHA, False),
    ],
)
def test_unchanged_rules(doc: Document, sha: str, unchanged: bool) -> None:
    assert _unchanged(doc, sha, {}) is unchanged


def test_new_metadata_is_a_change() -> None:
    doc = _doc(DocStatus.READY, metadata={"team": "a"})
    assert _unchanged(doc, SHA, {"team": "a"}) is True
    assert _unchanged(doc, SHA, {"team": "b"}) is False

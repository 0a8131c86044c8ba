"""A document's title: the caller's, its first heading, its file name; a text sent without any
name (identified by its content's hash) was titled by that hash id, as `doc-cbf83928d7ad19c1`."""

from __future__ import annotations

from shared.models import Document
from workers.stages.enrich import UNNAMED_TITLE_CHARS, document_title


def _doc(filename: str | None, doc_id: str = "doc-cbf83928d7ad19c1", **metadata: object) -> Document:
    return Document(
        tenant_id="t",
        kb_id="kb",
        doc_id=doc_id,
        filename=filename,
        content_hash="h",
        file_size=1,
        metadata=metadata,
    )


def test_an_unnamed_text_is_titled_by_its_first_line() -> None:
    assert document_title(_doc(None), None, "\n\n# Deploy notes \nsecond line") == "Deploy notes"
    assert document_title(_doc(None), None, "word " * 100) == ("word " * 100)[:UNNAMED_TITLE_CHARS].strip()
    assert document_title(_doc(None), None, "") == "doc-cbf83928d7ad19c1"


def test_a_heading_a_given_title_and_a_file_name_come_first() -> None:
    assert document_title(_doc(None), "Heading", "first line") == "Heading"
    assert document_title(_doc(None, title="Given"), "Heading", "first line") == "Given"
    assert document_title(_doc("notes.md", "notes.md"), None, "first line") == "notes"

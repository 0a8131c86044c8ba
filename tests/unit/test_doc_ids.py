"""Document ids are labels: derived ones have no segment that climbs elsewhere, and explicit ones
that could mislead a path, a log line or a reader are refused before anything is stored."""

from __future__ import annotations

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.models import check_doc_id, safe_doc_id
from tests.fixtures.hostile import PATH_NAMES


@pytest.mark.parametrize(
    ("raw", "doc_id"),
    [
        ("report.pdf", "report.pdf"),
        ("docs/guide.md", "docs/guide.md"),
        ("../../etc/passwd", "etc/passwd"),
        ("..\\..\\windows\\win.ini", "windows/win.ini"),
        ("/etc/passwd", "etc/passwd"),
        ("notes/../../../../etc/passwd", "notes/etc/passwd"),
        ("a/./b//c", "a/b/c"),
        ("..", "document"),
    ],
)
def test_ids_keep_the_name_without_dot_segments(raw: str, doc_id: str) -> None:
    assert safe_doc_id(raw) == doc_id


@pytest.mark.parametrize("name", PATH_NAMES)
def test_no_hostile_name_gives_an_id_with_a_dot_segment(name: str) -> None:
    segments = safe_doc_id(name).split("/")
    assert not {".", "..", ""} & set(segments)


@pytest.mark.parametrize(
    "doc_id",
    [
        "../../etc/passwd",
        "notes/../secret",
        "./here",
        "/etc/passwd",
        "a//b",
        "trailing/",
        "..\\..\\win.ini",
        "nul\x00byte",
        "new\nline",
        "tab\there",
        "del\x7f",
        "c1\x85control",
        "invoice\u202egnp.exe",
        "isolate\u2066x\u2069",
        "mark\u200f",
        "line\u2028separator",
        "lone\ud800surrogate",
        "x" * 201,
        "\u00e9" * 151,  # 151 characters, 302 UTF-8 bytes
        "",
        " ",
        "\t \u3000",
        " leading.txt",
        "trailing.txt ",
        "\u00a0nbsp",
    ],
)
def test_explicit_ids_that_mislead_are_refused(doc_id: str) -> None:
    with pytest.raises(RaglineError) as refused:
        check_doc_id(doc_id)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert doc_id not in refused.value.message or not doc_id.strip()  # caller content is never echoed


@pytest.mark.parametrize(
    "doc_id",
    ["report.pdf", "docs/guide.md", "part0/note0.txt", "Q3 report (final).pdf", "ü" * 150, "x" * 200, "a..b"],
)
def test_ordinary_explicit_ids_are_kept_as_given(doc_id: str) -> None:
    assert check_doc_id(doc_id) == doc_id


@pytest.mark.parametrize("name", PATH_NAMES)
def test_every_derived_id_passes_the_explicit_rule(name: str) -> None:
    assert check_doc_id(safe_doc_id(name)) == safe_doc_id(name)

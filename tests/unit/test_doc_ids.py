"""Document ids are labels: derived ones have no segment that climbs elsewhere, and explicit ones
that could mislead a path, a log line or a reader are refused before anything is stored."""

from __future__ import annotations

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.models import check_doc_id, file_label, safe_doc_id
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
        ("my file (1).txt", "my-file-1-.txt"),
        ("日本.txt", "日本.txt"),
        ("отчёт.txt", "отчёт.txt"),
        ("हिन्दी.md", "हिन्दी.md"),
        ("e\u0301te\u0301.txt", "\u00e9t\u00e9.txt"),  # decomposed accents: the composed name's id
        ("report\u202egnp.exe", "report-gnp.exe"),
    ],
)
def test_ids_keep_the_name_without_dot_segments(raw: str, doc_id: str) -> None:
    assert safe_doc_id(raw) == doc_id


def test_names_in_other_scripts_stay_apart() -> None:
    """An ASCII-only rule made them all "txt": each upload replaced the one before."""
    names = ["日本.txt", "中国.txt", "отчёт.txt", "счёт.txt", "ελληνικά.txt", "عربي.txt", "txt"]
    assert len({safe_doc_id(name) for name in names}) == len(names)


@pytest.mark.parametrize("name", ["日" * 150 + ".txt", "x" * 250, "ü" * 199])
def test_a_long_name_gives_an_id_within_the_registry_keys_bounds(name: str) -> None:
    assert check_doc_id(safe_doc_id(name)) == safe_doc_id(name)


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


def test_files_of_one_upload_that_would_be_one_document_are_refused() -> None:
    """Accepted both, the second replaced the first, each answered as accepted."""
    from services.api.upload_body import _one_file_a_document

    _one_file_a_document(["日本.txt", "中国.txt", "a-b.txt"])
    with pytest.raises(RaglineError) as refused:
        _one_file_a_document(["c.txt", "a b.txt", "a-b.txt"])
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.details["files"] == [1, 2]


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("report.pdf", "report.pdf"),
        ("../../etc/passwd", "passwd"),
        ("a\x00b.txt", "ab.txt"),
        ("x\u202egnp.exe", "xgnp.exe"),
        ("", "upload"),
    ],
)
def test_a_file_name_is_kept_as_a_printable_label(name: str, label: str) -> None:
    assert file_label(name) == label

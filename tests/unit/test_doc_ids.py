"""Document ids derived from file names are labels: no segment of one can climb elsewhere."""

from __future__ import annotations

import pytest

from shared.models import safe_doc_id
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

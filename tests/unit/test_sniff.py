"""File types are judged from the bytes; names only refine text types."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import ErrorCode, PermanentError
from tests.fixtures import hostile, samples
from workers.sniff import FileKind, detect


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("notes.txt", FileKind.TEXT),
        ("guide.md", FileKind.MARKDOWN),
        ("page.html", FileKind.HTML),
        ("data.xml", FileKind.XML),
        ("config.json", FileKind.JSON),
        ("table.csv", FileKind.CSV),
        ("mail.eml", FileKind.EML),
        ("report.docx", FileKind.DOCX),
        ("deck.pptx", FileKind.PPTX),
        ("sheet.xlsx", FileKind.XLSX),
        ("paper.pdf", FileKind.PDF),
    ],
)
def test_every_sample_is_recognised(name: str, kind: FileKind) -> None:
    data, _ = samples.every_type()[name]
    assert detect(data, name) == kind


def test_a_misleading_name_does_not_change_a_binary_type() -> None:
    pdf = samples.text_pdf([["hello"]])
    assert detect(pdf, "innocent.txt") == FileKind.PDF
    html, _ = samples.every_type()["page.html"]
    assert detect(html, "page.md") == FileKind.HTML


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"", ErrorCode.EMPTY_DOCUMENT),
        (b"MZ\x90\x00" + bytes(200), ErrorCode.UNSUPPORTED_MEDIA_TYPE),
        (b"\x7fELF\x02\x01\x01" + bytes(100), ErrorCode.UNSUPPORTED_MEDIA_TYPE),
        (bytes(range(256)) * 8, ErrorCode.UNSUPPORTED_MEDIA_TYPE),
        (b"PK\x03\x04corrupt", ErrorCode.PARSE_ERROR),
    ],
)
def test_bad_bytes_are_refused_with_a_code(data: bytes, code: ErrorCode) -> None:
    with pytest.raises(PermanentError) as caught:
        detect(data, "file.txt")
    assert caught.value.code == code


def test_markup_after_many_comments_is_judged_in_linear_time() -> None:
    # A regex repeating `(<!--.*?-->)*` backtracked exponentially here: the test never ended.
    comments = b"<!--a-->" * 8000
    assert detect(comments + b"plain words", "notes.txt") == FileKind.TEXT
    assert detect(comments + b"<html><body>x</body></html>", "page") == FileKind.HTML
    assert detect(comments + b"<root>x</root>", "data") == FileKind.XML


def test_xml_opening_with_a_doctype_is_xml_so_parse_refuses_it() -> None:
    bare = hostile.xxe(Path("/etc/hostname"), declaration=False)
    assert bare.startswith(b"<!DOCTYPE")
    assert detect(bare, "note.txt") == FileKind.XML


def test_an_svg_image_is_refused_as_an_image() -> None:
    svg = b'<?xml version="1.0" encoding="UTF-8"?>\n<!-- Generator: doxygen -->\n<svg xmlns="http://www.w3.org/2000/svg"/>'
    with pytest.raises(PermanentError) as caught:
        detect(svg, "doxygen.svg")
    assert caught.value.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert "SVG" in caught.value.message


def test_an_html_fragment_is_html_not_xml() -> None:
    # bash-doc's examples/INDEX.html: one table, unquoted attributes; as XML it did not parse.
    fragment = b"<table border=1>\n  <tr>\n    <th>Path</th>\n  </tr>\n  <tr><td>./misc<td>More\n</table>\n"
    assert detect(fragment, "INDEX.html") == FileKind.HTML
    assert detect(b'<?xml version="1.0"?>\n<table><row/></table>', "data.xml") == FileKind.XML


def test_json_longer_than_the_head_read_is_still_json(tmp_path: Path) -> None:
    path = tmp_path / "export"  # no extension: the bytes decide
    path.write_text("[" + ",".join(f'{{"id": {n}, "name": "item {n}"}}' for n in range(60_000)) + "]")
    head = path.read_bytes()[: 1 << 20]
    assert path.stat().st_size > len(head)
    assert detect(head, path.name, path) == FileKind.JSON
    path.write_text(path.read_text()[:-1] + ",")  # broken at its end: text, as before
    assert detect(path.read_bytes()[: 1 << 20], path.name, path) == FileKind.TEXT

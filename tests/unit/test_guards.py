"""Hostile input is refused with a stable code before a parser expands it; real documents pass."""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from shared.config import ParseSettings
from shared.errors import ErrorCode, PermanentError
from tests.fixtures import hostile, samples
from workers.guards import (
    PROLOG_BYTES,
    check_archive,
    check_html,
    check_pdf,
    root_follows_prolog,
    without_harmless_doctype,
)

LIMITS = ParseSettings()


def _file(tmp_path: Path, data: bytes, name: str = "file") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _refused(call: Callable[[], object], code: ErrorCode) -> str:
    with pytest.raises(PermanentError) as caught:
        call()
    assert caught.value.code == code
    return caught.value.message


@pytest.mark.parametrize(
    "data",
    [
        samples.docx("Report", {"Revenue": "Up."}),
        samples.pptx({"Slide": "Body"}),
        samples.xlsx({"Sheet": [["a", 1], ["b", 2]]}),
        hostile.docx_bomb(0),
    ],
)
def test_real_office_files_pass(tmp_path: Path, data: bytes) -> None:
    check_archive(_file(tmp_path, data), LIMITS)


def test_a_zip_bomb_is_refused_from_its_directory(tmp_path: Path) -> None:
    message = _refused(
        lambda: check_archive(_file(tmp_path, hostile.docx_bomb(64)), LIMITS), ErrorCode.TOO_LARGE
    )
    assert f"over the limit of {LIMITS.max_archive_ratio}:1" in message


def test_the_total_expanded_size_is_bounded(tmp_path: Path) -> None:
    # Random bytes do not compress: the ratio is fine, only the total is over.
    noise = hostile.random_bytes(3 << 20)
    with io.BytesIO(hostile.docx_bomb(0)) as buffer:
        with zipfile.ZipFile(buffer, "a") as archive:
            archive.writestr("word/media/noise.bin", noise, compress_type=zipfile.ZIP_DEFLATED)
        data = buffer.getvalue()
    limits = ParseSettings(max_archive_bytes=2 << 20)
    message = _refused(lambda: check_archive(_file(tmp_path, data), limits), ErrorCode.TOO_LARGE)
    assert "over the limit of 2097152" in message
    check_archive(_file(tmp_path, data), LIMITS)


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    limits = ParseSettings(max_archive_members=10)
    path = _file(tmp_path, hostile.docx_with_members(8))
    _refused(lambda: check_archive(path, limits), ErrorCode.TOO_LARGE)
    check_archive(_file(tmp_path, hostile.docx_with_members(7)), limits)


def test_a_member_inflating_past_its_declared_size_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, hostile.lying_docx(64, declared_size=4096))
    # zipfile alone would hand the partitioner a well-formed-looking member with a matching CRC.
    with zipfile.ZipFile(path) as archive:
        assert len(archive.read("word/document.xml")) == 4096
    message = _refused(lambda: check_archive(path, LIMITS), ErrorCode.PARSE_ERROR)
    assert "declares" in message


def test_compression_methods_without_a_bounded_reader_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("[Content_Types].xml", hostile._CONTENT_TYPES)
        archive.writestr("word/document.xml", b"<w:document/>")
    _refused(lambda: check_archive(_file(tmp_path, buffer.getvalue()), LIMITS), ErrorCode.PARSE_ERROR)


def test_a_dtd_inside_an_office_file_is_refused(tmp_path: Path) -> None:
    path = _file(tmp_path, hostile.docx_with_dtd(tmp_path / "canary.txt"))
    _refused(lambda: check_archive(path, LIMITS), ErrorCode.PARSE_ERROR)


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ('<?xml version="1.0"?>\n<root/>', True),
        ("\ufeff<!-- note --><?pi x?>\n<root>x</root>", True),
        ("<root>x</root>", True),
        (hostile.billion_laughs().decode(), False),
        (hostile.billion_laughs(padding=100_000).decode(), False),
        (hostile.xxe(Path("/etc/hostname"), declaration=False).decode(), False),
        ("<!-- never closed <root/>", False),
        ("", False),
    ],
)
def test_only_a_root_may_follow_the_prolog(text: str, ok: bool) -> None:
    assert root_follows_prolog(text) is ok


def test_a_pdf_stream_bomb_is_refused_and_a_real_pdf_passes(tmp_path: Path) -> None:
    _refused(lambda: check_pdf(_file(tmp_path, hostile.pdf_bomb(100))), ErrorCode.TOO_LARGE)
    check_pdf(_file(tmp_path, hostile.pdf_bomb(0)))
    check_pdf(_file(tmp_path, samples.text_pdf([["hello"], ["world"]])))
    check_pdf(_file(tmp_path, b"%PDF-1.4 damaged beyond repair"))  # left to the partitioner


def test_html_nested_past_the_parsers_depth_is_refused() -> None:
    _refused(lambda: check_html(hostile.nested_html(300).decode()), ErrorCode.PARSE_ERROR)
    check_html(hostile.nested_html(200).decode())


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        # libxml2's examples/test2.xml: element and attribute declarations only.
        (
            "<!DOCTYPE doc [\n<!ELEMENT doc (src | dest)*>\n<!ATTLIST src ref IDREF #IMPLIED>\n]>\n"
            "<doc><src/></doc>",
            "\n<doc><src/></doc>",
        ),
        # DocBook source: a DTD named, never read.
        (
            '<?xml version="1.0"?>\n<!DOCTYPE book PUBLIC "-//OASIS//DTD DocBook XML V4.5//EN" '
            '"http://www.oasis-open.org/docbook/xml/4.5/docbookx.dtd">\n<book>x</book>',
            '<?xml version="1.0"?>\n\n<book>x</book>',
        ),
        # Brackets and quotes inside literals and comments do not end the declaration.
        ('<!DOCTYPE d [<!-- ]> --><!ATTLIST d a CDATA "]>">]><d/>', "<d/>"),
        ("<root>x</root>", "<root>x</root>"),
    ],
)
def test_a_doctype_without_entities_is_dropped(text: str, kept: str) -> None:
    assert without_harmless_doctype(text) == kept


@pytest.mark.parametrize(
    "text",
    [
        hostile.billion_laughs().decode(),
        hostile.billion_laughs(padding=100_000).decode(),
        hostile.xxe(Path("/etc/hostname")).decode(),
        hostile.xxe(Path("/etc/hostname"), declaration=False).decode(),
        '<!DOCTYPE d [<!ENTITY % remote SYSTEM "http://example.org/x.dtd"> %remote;]><d/>',
        "<!DOCTYPE d [<!ATTLIST d a CDATA 'never closed>]><d/>",
        "<!DOCTYPE d [" + " " * (PROLOG_BYTES + 10) + "]><d/>",
        "<!DOCTYPE d><!DOCTYPE e [<!ENTITY x 'y'>]><d>&x;</d>",
    ],
)
def test_a_doctype_with_entities_is_refused(text: str) -> None:
    _refused(lambda: without_harmless_doctype(text), ErrorCode.PARSE_ERROR)


def test_a_text_file_too_large_for_its_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file past 4 bytes a character holds too many characters in any encoding: it is refused
    from its size, JSON or not, without reading, decoding or parsing it whole."""
    from workers.stages import parse

    limits = ParseSettings(max_text_chars=100_000)
    padded_json = b"[" + b" " * (2 << 20) + b'"a short value"]'  # valid, 2 MiB, little text
    broken_json = b"[" + b"x" * (2 << 20)
    for data in (padded_json, broken_json):
        path = _file(tmp_path, data, "export")
        with monkeypatch.context() as patched:

            def unread(self: Path) -> bytes:
                raise AssertionError(f"{self} was read whole")

            patched.setattr(Path, "read_bytes", unread)
            message = _refused(partial(parse._parse, path, "export", limits, ocr=False), ErrorCode.TOO_LARGE)
        assert "more than the limit of 100000 characters" in message
    # Within the byte bound, a file longer than the detection head is still judged whole.
    path = _file(tmp_path, padded_json, "export")
    parsed = parse._parse(path, "export", ParseSettings(max_text_chars=1 << 20), ocr=False)
    assert parsed["kind"] == "application/json"

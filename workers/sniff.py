"""File type detection from the bytes. The caller's name and header only refine within text types."""

from __future__ import annotations

import csv
import io
import json
import re
import zipfile
from enum import StrEnum
from pathlib import Path

from shared.errors import ErrorCode, PermanentError
from workers.guards import prolog_end
from workers.text_encoding import byte_order_encoding, decode


class FileKind(StrEnum):
    PDF = "application/pdf"
    DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    HTML = "text/html"
    XML = "application/xml"
    JSON = "application/json"
    CSV = "text/csv"
    EML = "message/rfc822"
    MARKDOWN = "text/markdown"
    TEXT = "text/plain"


_BINARY_SIGNATURES: dict[bytes, str] = {
    b"MZ": "a Windows executable",
    b"\x7fELF": "an ELF executable",
    b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1": "a legacy Office (OLE) file; save it as .docx, .pptx or .xlsx",
    b"\x89PNG": "a PNG image",
    b"\xff\xd8\xff": "a JPEG image",
    b"GIF8": "a GIF image",
    b"\x1f\x8b": "a gzip archive",
    b"Rar!": "a RAR archive",
    b"7z\xbc\xaf": "a 7-Zip archive",
    b"%!PS": "a PostScript file",
}
# ZIP containers that are parsed, so expanded: workers/guards.py checks them first.
ARCHIVE_KINDS = frozenset({FileKind.DOCX, FileKind.PPTX, FileKind.XLSX})
_OOXML_PARTS = {
    "word/document.xml": FileKind.DOCX,
    "ppt/presentation.xml": FileKind.PPTX,
    "xl/workbook.xml": FileKind.XLSX,
}
_EMAIL_HEADER = re.compile(
    rb"^(From|To|Subject|Date|Message-ID|MIME-Version|Received|Return-Path):", re.I | re.M
)
# Both are matched after the comments and declarations that open a file (see prolog_end):
# a regex repeating `(<!--.*?-->)*` itself backtracks exponentially on a file of many comments.
_HTML_START = re.compile(r"<!doctype html|<html|<head|<body|<div|<p[ >]|<h[1-6][ >]", re.I)
# A page fragment (bash's examples/INDEX.html is one <table>) opens with an element only HTML has;
# as XML its unquoted attributes and unclosed tags would not parse.
_HTML_FRAGMENT_START = re.compile(
    r"<(?:table|tr|ul|ol|dl|pre|center|font|blockquote|frameset|iframe|form|hr|br|img|span|"
    r"a|b|i|em|strong|tt|code|title|meta|link|style|script)[\s>/]",
    re.I,
)
_SVG_START = re.compile(r"<!DOCTYPE\s+svg[\s>]|<svg[\s>/]|<[\w.-]+:svg[\s>/]", re.I)
# XML may open with a DOCTYPE: parse refuses it, with a clear code, rather than index it as text.
_XML_START = re.compile(r"<!DOCTYPE\s|<[A-Za-z_][\w.:-]*[\s>/]")
_MD_EXTENSIONS = (".md", ".markdown", ".mdx")
_CSV_EXTENSIONS = (".csv", ".tsv")
_SAMPLE = 64 * 1024


def unsupported(what: str) -> PermanentError:
    return PermanentError(f"unsupported file type: {what}", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)


def _zip_kind(data: bytes, path: Path | None) -> FileKind:
    try:
        # The directory of a ZIP is at its end: read the whole file when there is one.
        with zipfile.ZipFile(path if path is not None else io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except zipfile.BadZipFile:
        raise PermanentError(
            "the file looks like a ZIP container but is corrupt", code=ErrorCode.PARSE_ERROR
        ) from None
    for part, kind in _OOXML_PARTS.items():
        if part in names:
            return kind
    raise unsupported("a ZIP archive (archives are not expanded)")


def _decode(data: bytes) -> str:
    """The text, in its real encoding (workers/text_encoding.py); `data` may be a file's head."""
    wide = byte_order_encoding(data) not in (None, "utf-8-sig")  # UTF-16 and UTF-32 hold NULs
    if not wide and b"\x00" in data[:_SAMPLE]:
        raise unsupported("binary data")
    text = decode(data, markup=True, final=False)
    controls = sum(1 for ch in text[:_SAMPLE] if ord(ch) < 32 and ch not in "\t\n\r\f")
    if controls > max(8, len(text[:_SAMPLE]) // 100):
        raise unsupported("binary data")
    return text


def _looks_like_csv(text: str) -> bool:
    lines = [line for line in text[:_SAMPLE].splitlines() if line.strip()][:20]
    if len(lines) < 2:
        return False
    try:
        dialect = csv.Sniffer().sniff("\n".join(lines), delimiters=",;\t|")
    except csv.Error:
        return False
    widths = {len(row) for row in csv.reader(lines, dialect)}
    return len(widths) == 1 and widths.pop() > 1


def _ends_as_markup(text: str, whole: bool) -> bool:
    """Whether the text ends with a tag, as XML does; a text that only opens with one (asciidoc's
    `<refspec>::` list items) does not. Unknown for a file's head: taken as yes."""
    return not whole or text.rstrip().endswith(">")


def _markup_kind(stripped: str, whole: bool) -> FileKind | None:
    """HTML or XML, judged from the start of the text after its prolog; None for other text.

    `whole`: `stripped` is the whole file, so its end can be judged too.
    """
    markup = stripped[:_SAMPLE]
    markup = markup[prolog_end(markup) :].lstrip()
    if _HTML_START.match(markup):
        return FileKind.HTML
    if _SVG_START.match(markup):
        raise unsupported("an SVG image")
    declared_xml = stripped.startswith("<?xml")
    if _HTML_FRAGMENT_START.match(markup) and not declared_xml:
        return FileKind.HTML
    if declared_xml or (_XML_START.match(markup) and _ends_as_markup(stripped, whole)):
        return FileKind.XML
    return None


# Declared types that say what a name's extension would, between text kinds (the bytes alone cannot).
_DECLARED_TEXT_KINDS = {
    "text/markdown": _MD_EXTENSIONS,
    "text/x-markdown": _MD_EXTENSIONS,
    "text/csv": _CSV_EXTENSIONS,
    "text/tab-separated-values": _CSV_EXTENSIONS,
}


def name_hint(filename: str | None, declared: str | None) -> str | None:
    """The name `detect` should see for a file a server declared to be of type `declared`: the
    name, given the extension of a declared Markdown or CSV type where it has none of its own.

    The declared type refines only as an upload's name does, between text kinds; the bytes still
    decide everything else (HTML served as text/plain is HTML).
    """
    extensions = _DECLARED_TEXT_KINDS.get((declared or "").lower())
    if extensions is None or (filename or "").lower().endswith(extensions):
        return filename
    return f"{filename or 'document'}{extensions[0]}"


def detect(
    data: bytes, filename: str | None, path: Path | None = None, *, whole_limit: int | None = None
) -> FileKind:
    """The kind of a file, judged from its content; the name only tells Markdown and CSV from text.

    `data` may be just the file's head when `path` gives the whole file. A file longer than its
    head is read whole to judge it JSON only up to `whole_limit` bytes: past that it is text,
    which its size guard refuses before reading it.
    """
    if not data:
        raise PermanentError("the file is empty", code=ErrorCode.EMPTY_DOCUMENT)
    head = data[:16]
    if data.lstrip()[:5] == b"%PDF-":
        return FileKind.PDF
    if head.startswith(b"PK\x03\x04"):
        return _zip_kind(data, path)
    for signature, what in _BINARY_SIGNATURES.items():
        if head.startswith(signature):
            raise unsupported(what)
    text = _decode(data)
    stripped = text.lstrip("\ufeff \t\r\n")
    sample = stripped[:_SAMPLE].encode("utf-8", "replace")
    name = (filename or "").lower()
    if _EMAIL_HEADER.match(sample) and len(_EMAIL_HEADER.findall(sample[:4096])) >= 2:
        return FileKind.EML
    size = len(data) if path is None else path.stat().st_size
    whole = size == len(data)
    markup_kind = _markup_kind(stripped, whole)
    if markup_kind is not None:
        return markup_kind
    if stripped[:1] in "[{" and (whole or whole_limit is None or size <= whole_limit):
        try:
            # Past its head, the whole file decides: a head alone is never valid JSON.
            json.loads(stripped if whole or path is None else decode(path.read_bytes()))
            return FileKind.JSON
        except ValueError:
            pass
    if name.endswith(_MD_EXTENSIONS):
        return FileKind.MARKDOWN
    if name.endswith(_CSV_EXTENSIONS) and _looks_like_csv(text):
        return FileKind.CSV
    return FileKind.TEXT

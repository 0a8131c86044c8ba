"""Refusals of hostile input before a parser expands it: ZIP bombs, DTDs, PDF stream bombs, deep HTML.

Archives are judged from their central directory, which declares every member's sizes without
expanding anything. A directory may lie, and Python's zipfile, used by every Office partitioner,
inflates up to 1 GiB in one read before cutting the output to the declared size (bzip2 and LZMA
members with no bound at all). So every member is also inflated once here, in small steps, and
refused the moment it outgrows its declared size; the parse sandbox's limits bound the rest.
Messages give sizes only, never member names or content, which the sender controls.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from shared.config import ParseSettings
from shared.errors import ErrorCode, PermanentError

# A small member compresses extremely well without harm (a page of spaces): ratios count above this.
RATIO_FLOOR = 1 << 20
# The prolog (declaration, comments, DTD) of an XML member is read up to this many bytes.
PROLOG_BYTES = 64 << 10
_STEP = 1 << 20
_LOCAL_HEADER = struct.Struct("<4s22xHH")
_XML_MEMBER = (".xml", ".rels", ".vml")
_PROLOG_ITEM = re.compile(r"\s*(?:<\?.*?\?>|<!--.*?-->)", re.S)
_ROOT_START = re.compile(r"\s*<[A-Za-z_]")
_SPACE = re.compile(r"\s*")


def _too_large(message: str) -> PermanentError:
    return PermanentError(message, code=ErrorCode.TOO_LARGE)


def _corrupt(message: str) -> PermanentError:
    return PermanentError(message, code=ErrorCode.PARSE_ERROR)


def prolog_end(text: str) -> int:
    """Where the declarations, processing instructions and comments that open `text` end.

    Linear in the length of `text`, however many comments it holds.
    """
    position = 1 if text.startswith("\ufeff") else 0
    while (item := _PROLOG_ITEM.match(text, position)) is not None and item.end() > position:
        position = item.end()
    return position


def root_follows_prolog(text: str) -> bool:
    """Whether the XML's root element starts after a prolog of only declarations and comments.

    False for a document type declaration, the only place entities are declared (XXE, billion
    laughs), and for a prolog that does not end within `text`.
    """
    return _ROOT_START.match(text, prolog_end(text)) is not None


def refuse_dtd(text: str) -> None:
    if not root_follows_prolog(text):
        raise _corrupt("XML with a document type declaration (DTD) or without a root element is refused")


def _doctype_end(text: str, start: int) -> int | None:
    """Where the `<!DOCTYPE` at `start` ends, past its internal subset; None when it does not end
    within PROLOG_BYTES. Quoted literals and comments may hold `]` and `>`."""
    position, limit, in_subset = start + len("<!DOCTYPE"), min(len(text), start + PROLOG_BYTES), False
    while position < limit:
        char = text[position]
        if char in "\"'":
            close = text.find(char, position + 1, limit)
            if close < 0:
                return None
            position = close + 1
            continue
        if in_subset and text.startswith("<!--", position):
            close = text.find("-->", position + 4, limit)
            if close < 0:
                return None
            position = close + 3
            continue
        if char == "[" and not in_subset:
            in_subset = True
        elif char == "]" and in_subset:
            in_subset = False
        elif char == ">" and not in_subset:
            return position + 1
        position += 1
    return None


def without_harmless_doctype(text: str) -> str:
    """XML without its document type declaration, when that declares no entity; refused otherwise.

    Entities are how XXE and billion laughs work, and documents need none. A DOCTYPE that only
    names a DTD (DocBook, XHTML) or declares elements and attributes (libxml2's examples) is
    dropped, so no parser ever reads it, let alone fetches the DTD it names.
    """
    start = _SPACE.match(text, prolog_end(text)).end()  # type: ignore[union-attr]  # \s* always matches
    if not text.startswith("<!DOCTYPE", start):
        refuse_dtd(text)
        return text
    end = _doctype_end(text, start)
    if end is None or "<!ENTITY" in text[start:end]:
        raise _corrupt("XML whose document type declaration (DTD) declares entities is refused")
    stripped = text[:start] + text[end:]
    refuse_dtd(stripped)
    return stripped


def _decode(head: bytes) -> str:
    # OPC allows UTF-16 parts, which then start with a byte order mark.
    encoding = "utf-16" if head.startswith((b"\xff\xfe", b"\xfe\xff")) else "utf-8"
    return head.decode(encoding, errors="replace")


def check_archive(path: Path, limits: ParseSettings) -> None:
    """Refuse a ZIP-based document that declares, or actually holds, too much; and DTDs in its XML."""
    try:
        with zipfile.ZipFile(path) as archive, path.open("rb") as raw:
            members = archive.infolist()
            _check_sizes(members, limits)
            for member in members:
                head = _inflate_bounded(raw, member)
                if member.filename.lower().endswith(_XML_MEMBER) and head.strip():
                    refuse_dtd(_decode(head))  # an empty part gives a parser nothing to expand
    except (zipfile.BadZipFile, EOFError, zlib.error, struct.error):
        raise _corrupt("the archive is corrupt") from None


def _inflate_bounded(raw: BinaryIO, member: zipfile.ZipInfo) -> bytes:
    """Inflate the member in steps of a MiB, refusing it once it outgrows its declared size.

    Returns its first PROLOG_BYTES.
    """
    if member.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise _corrupt("an archive member uses a compression method Office documents never use")
    if member.flag_bits & 0x1:
        raise _corrupt("the archive is encrypted")
    raw.seek(member.header_offset)
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise zipfile.BadZipFile("no local header")
    raw.seek(member.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
    if member.compress_type == zipfile.ZIP_STORED:
        return raw.read(min(PROLOG_BYTES, member.file_size))
    inflater = zlib.decompressobj(-zlib.MAX_WBITS)
    head, produced, unread = b"", 0, member.compress_size
    while unread > 0 and not inflater.eof:
        pending = raw.read(min(unread, _STEP))
        if not pending:
            break
        unread -= len(pending)
        while pending and not inflater.eof:
            out = inflater.decompress(pending, _STEP)
            produced += len(out)
            if produced > member.file_size:
                raise _corrupt("an archive member expands past the size its directory declares")
            if len(head) < PROLOG_BYTES:
                head += out[: PROLOG_BYTES - len(head)]
            pending = inflater.unconsumed_tail
    return head


def _check_sizes(members: list[zipfile.ZipInfo], limits: ParseSettings) -> None:
    if len(members) > limits.max_archive_members:
        raise _too_large(
            f"the archive holds {len(members)} members, over the limit of {limits.max_archive_members}"
        )
    total = 0
    for member in members:
        total += member.file_size
        ratio = member.file_size // max(member.compress_size, 1)
        if member.file_size > RATIO_FLOOR and ratio > limits.max_archive_ratio:
            raise _too_large(
                f"an archive member expands {ratio}:1, over the limit of {limits.max_archive_ratio}:1"
            )
    if total > limits.max_archive_bytes:
        raise _too_large(
            f"the archive expands to {total} bytes, over the limit of {limits.max_archive_bytes}"
        )


def check_pdf(path: Path) -> None:
    """Refuse a PDF with a page content stream that inflates past pypdf's decode limit (75 MB).

    unstructured would quietly skip such a page as "too complex" and OCR would then render it,
    inflating the stream whole; the sender gets a clear code instead.
    """
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError

    try:
        for page in PdfReader(path).pages:
            contents = page.get_contents()
            if contents is not None:
                contents.get_data()
    except LimitReachedError:
        raise _too_large("a PDF content stream expands past the decode limit") from None
    except Exception:  # noqa: BLE001, S110  (a damaged PDF: the partitioner, which repairs more, decides)
        pass


def check_html(text: str) -> None:
    """Refuse HTML nested deeper than libxml2 parses (256 levels): the partitioner would silently
    drop everything below that depth."""
    from lxml import etree

    parser = etree.HTMLParser()
    etree.fromstring(text, parser)
    if any(error.type_name == "ERR_RESOURCE_LIMIT" for error in parser.error_log):
        raise _corrupt("the document is nested too deeply")

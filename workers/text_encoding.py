"""Bytes → text for every text kind, in the encoding the bytes are really in.

The order: a byte order mark, which decides alone; then UTF-8, when the bytes are valid UTF-8 (text in another
encoding is almost never valid UTF-8, while declarations copied from a template often lie);
then what the markup declares, its XML declaration first, then a `<meta charset>`; then
windows-1252, which decodes most Western text; and latin-1, which decodes anything.

Markup keeps no XML declaration once decoded: lxml refuses a `str` that has one, and a parser
given the text re-encoded would decode it again by the declaration.
"""

from __future__ import annotations

import codecs
import re

_BOMS = (
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16: it starts with the UTF-16 LE mark
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
# XML without a byte order mark in UTF-16 still opens with "<?" (XML 1.0, appendix F).
_UTF16_STARTS = ((b"<\x00?\x00", "utf-16-le"), (b"\x00<\x00?", "utf-16-be"))
# Declarations are read from the start of the file, as browsers do (they read 1024 bytes).
DECLARATION_BYTES = 8192
_XML_ENCODING = re.compile(rb"""^\s*<\?xml\s[^>]*?\bencoding\s*=\s*["']([A-Za-z0-9._:-]+)["']""")
_META_CHARSET = re.compile(rb"""<meta\s[^>]*?\bcharset\s*=\s*["']?([A-Za-z0-9._:-]+)""", re.I)
_XML_DECLARATION = re.compile(r"\A\s*<\?xml\s[^>]*\?>")
# As in browsers (WHATWG Encoding): these labels mean windows-1252, a superset.
_WINDOWS_1252_LABELS = {"latin-1", "iso8859-1", "ascii"}
_WIDE = {"utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"}


def byte_order_encoding(data: bytes) -> str | None:
    """The encoding a byte order mark (or a UTF-16 XML start) names; None without one."""
    for mark, encoding in _BOMS:
        if data.startswith(mark):
            return encoding
    for start, encoding in _UTF16_STARTS:
        if data.startswith(start):
            return encoding
    return None


def declared_encodings(data: bytes) -> list[str]:
    """The known encodings the markup's XML declaration, then its `<meta>`, name (Python names)."""
    head = data[:DECLARATION_BYTES]
    found = []
    for match in (_XML_ENCODING.match(head), _META_CHARSET.search(head)):
        if match is None:
            continue
        try:
            name = codecs.lookup(match.group(1).decode("ascii")).name
        except LookupError:
            continue
        # An ASCII-readable declaration of UTF-16 is a lie: those bytes are not UTF-16.
        if name in _WIDE:
            continue
        found.append("cp1252" if name in _WINDOWS_1252_LABELS else name)
    return found


def _strict(data: bytes, encoding: str, *, final: bool) -> str | None:
    try:
        return codecs.getincrementaldecoder(encoding)("strict").decode(data, final=final)
    except (UnicodeDecodeError, LookupError):
        return None


def decode(data: bytes, *, markup: bool = False, final: bool = True) -> str:
    """The text of `data`; `markup`: read the XML declaration and `<meta charset>` too.

    `final=False` for a file's head: a character cut at its end is not taken for bad bytes.
    """
    marked = byte_order_encoding(data)
    if marked is not None:
        # A byte order mark decides, as in browsers (WHATWG Encoding, BOM sniffing): a byte it
        # cannot read becomes U+FFFD. Another encoding would read the whole file wrong: windows-1252
        # made a UTF-16 file of odd length into "ÿþh\x00e\x00l\x00...".
        if marked == "utf-32" and _strict(data, marked, final=final) is None:
            # FF FE 00 00 is also UTF-16's mark before a NUL: bytes that are not UTF-32 are that.
            marked = "utf-16"
        return (
            codecs.getincrementaldecoder(marked)("replace").decode(data, final=final).removeprefix("\ufeff")
        )
    text = _strict(data, "utf-8", final=final)
    if text is not None:
        return text
    # Declarations are read only for bytes that are not UTF-8: most text is.
    for encoding in [*(declared_encodings(data) if markup else []), "cp1252"]:
        text = _strict(data, encoding, final=final)
        if text is not None:
            return text
    return data.decode("latin-1")


def without_xml_declaration(text: str) -> str:
    """Decoded markup without the `<?xml ...?>` that opens it (its encoding is no longer true)."""
    return _XML_DECLARATION.sub("", text, count=1)


def decode_markup(data: bytes) -> str:
    """HTML or XML bytes as text, without their XML declaration."""
    return without_xml_declaration(decode(data, markup=True))

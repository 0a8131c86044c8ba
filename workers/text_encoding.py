"""Bytes → text for every text kind, in the encoding the bytes are really in.

The order: a byte order mark, which decides alone; then ISO-2022 (Japanese mail and old Japanese
and Korean documents), when 7-bit bytes hold its escape sequences and it reads them; then UTF-8,
when the bytes are valid UTF-8 (text in another
encoding is almost never valid UTF-8, while declarations copied from a template often lie);
then what the markup declares, its XML declaration first, then a `<meta charset>`; then an
encoding charset-normalizer finds, when it reads the bytes as another script than Latin
(Shift_JIS, GBK, Big5, EUC-KR, windows-1251, ...); then windows-1252, which decodes most Western
text; and latin-1, which decodes anything.

The detector is heard only for other scripts: among the Latin encodings its guesses are noisy
(it read French windows-1252 as windows-1257), and windows-1252 is what browsers assume.

Markup keeps no XML declaration once decoded: lxml refuses a `str` that has one, and a parser
given the text re-encoded would decode it again by the declaration.
"""

from __future__ import annotations

import codecs
import re
import unicodedata

import charset_normalizer

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
_NON_ASCII = re.compile(rb"[\x80-\xff]")
# The escape sequences that switch ISO-2022-JP (and -JP-2, -JP-3) to a double-byte set, and
# ISO-2022-KR's header: ASCII text holds none of them.
_ISO_2022_ESCAPES = re.compile(rb"\x1b(?:\$[@B]|\$\([CDOPQ]|\(I|\$\)C)")
_ISO_2022_JP = ("iso2022_jp_2", "iso2022_jp_ext", "iso2022_jp_2004")
_ISO_2022_KR_HEADER = b"\x1b$)C"  # ISO-2022-JP-2 also takes it, and reads the Korean as a mess
DETECTOR_BYTES = 64 << 10
DETECTOR_MIN_BYTES = 64
# Scripts with legacy encodings of their own, by the first word of their letters' Unicode names.
_OTHER_SCRIPTS = (
    "CJK",
    "HIRAGANA",
    "KATAKANA",
    "HALFWIDTH KATAKANA",
    "HANGUL",
    "BOPOMOFO",
    "CYRILLIC",
    "GREEK",
    "HEBREW",
    "ARABIC",
    "THAI",
    "ARMENIAN",
    "GEORGIAN",
    "DEVANAGARI",
)
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
    text = _iso_2022(data, final=final)
    if text is not None:
        return text
    text = _strict(data, "utf-8", final=final)
    if text is not None:
        return text
    # Declarations are read only for bytes that are not UTF-8: most text is.
    for encoding in declared_encodings(data) if markup else []:
        text = _strict(data, encoding, final=final)
        if text is not None:
            return text
    text = _other_script(data, final=final)
    if text is not None:
        return text
    return _strict(data, "cp1252", final=final) or data.decode("latin-1")


def _iso_2022(data: bytes, *, final: bool) -> str | None:
    """`data` read as ISO-2022, when its 7-bit bytes switch to a double-byte set and one of the
    variants reads them whole; UTF-8 would read it too, escapes and all."""
    head = data[:DETECTOR_BYTES]
    if b"\x1b" not in head or _NON_ASCII.search(head) or not _ISO_2022_ESCAPES.search(head):
        return None
    korean = _ISO_2022_KR_HEADER in head
    for encoding in ("iso2022_kr",) if korean else _ISO_2022_JP:
        text = _strict(data, encoding, final=final)
        if text is not None:
            return text
    return None


def _sample(data: bytes) -> bytes:
    """What the detector reads: the lines holding bytes past ASCII, from a window of at most
    `DETECTOR_BYTES` that starts just before the first such byte and ends at a line's end (no
    character cut). It reads a whole file slowly, and ASCII lines only dilute its measure: code
    with Chinese comments passed for windows-1252 text."""
    first = _NON_ASCII.search(data)
    start = max(0, first.start() - 1024) if first else 0
    window = data[start : start + DETECTOR_BYTES]
    if len(window) == DETECTOR_BYTES and (end := window.rfind(b"\n")) > 0:
        window = window[: end + 1]
    return b"\n".join(line for line in window.split(b"\n") if _NON_ASCII.search(line))


def _other_script(data: bytes, *, final: bool) -> str | None:
    """`data` in the encoding the detector finds, if that reads it as another script than Latin
    while windows-1252 reads it as a mess.

    Asked only with evidence enough: bytes windows-1252 leaves undefined, or a sentence's worth
    of bytes past ASCII; on a few it guesses wildly (windows-1251 for `“quoted” café`). Its
    guess must also beat windows-1252 by its own measure, for it reads some Latin text as another
    script too (Finnish with an `š` as mac_iceland, Slovene as Korean).
    """
    sample = _sample(data)
    if (
        len(_NON_ASCII.findall(sample)) < DETECTOR_MIN_BYTES
        and _strict(sample, "cp1252", final=False) is not None
    ):
        return None
    best = charset_normalizer.from_bytes(sample).best()
    if best is None or best.encoding is None or not _mostly_other_script(str(best)):
        return None
    if charset_normalizer.from_bytes(sample, cp_isolation=["cp1252"]).best() is not None:
        return None  # windows-1252 reads it without a mess: Latin text, as browsers assume
    return _strict(data, best.encoding, final=final)


def _mostly_other_script(text: str) -> bool:
    """Whether most letters past ASCII belong to a script other than Latin (Unicode names: a
    modifier letter such as `ˆ`, which a Mac code page makes of `ö`, belongs to none)."""
    letters = [c for c in text if ord(c) > 0x7F and c.isalpha()]
    other = sum(1 for c in letters if unicodedata.name(c, "").startswith(_OTHER_SCRIPTS))
    return other * 2 > len(letters)


def without_xml_declaration(text: str) -> str:
    """Decoded markup without the `<?xml ...?>` that opens it (its encoding is no longer true)."""
    return _XML_DECLARATION.sub("", text, count=1)


def decode_markup(data: bytes) -> str:
    """HTML or XML bytes as text, without their XML declaration."""
    return without_xml_declaration(decode(data, markup=True))

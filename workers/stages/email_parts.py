"""An e-mail's attachments as bytes, so that each is judged and guarded like an upload.

unstructured would partition attachments itself, with no type allow-list and none of the checks
of workers/guards.py: a zip bomb or a DTD attached to a message was expanded. parse.py partitions
only the message body with unstructured and hands each attachment back to its own pipeline.
"""

from __future__ import annotations

import codecs
import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from email import policy
from email.header import decode_header
from email.message import EmailMessage, Message
from email.parser import BytesParser
from pathlib import Path

from workers.text_encoding import decode

_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes past ASCII a header parser kept undecoded


@dataclass(frozen=True)
class Attachment:
    name: str | None  # as the sender wrote it: a label, never a path
    data: bytes


def _bytes_of(part: EmailMessage) -> bytes:
    if part.is_multipart():
        # An attached message, or a multipart part (a signed message): the whole part, as sent.
        inner = part.get_payload()
        if part.get_content_type() == "message/rfc822" and isinstance(inner, list) and inner:
            enclosed = inner[0]
            if isinstance(enclosed, Message):
                return enclosed.as_bytes()
        return part.as_bytes()
    payload = part.get_payload(decode=True)  # base64 and quoted-printable undone
    return payload if isinstance(payload, bytes) else b""


def attachments(path: Path) -> Iterator[Attachment]:
    """The attachments of the message at `path`, in order (not those of attached messages)."""
    with path.open("rb") as handle:
        message = BytesParser(policy=policy.default).parse(handle)
    if not isinstance(message, EmailMessage):
        return
    for part in message.iter_attachments():
        if isinstance(part, EmailMessage):
            yield Attachment(part.get_filename(), _bytes_of(part))


def subject(path: Path) -> str | None:
    """The message's Subject, its encoded words decoded and its whitespace folded; None if blank.

    It is what names a message, where the partitioner gives the body alone: the document's title
    was its file name, or the label of its first attachment.
    """
    with path.open("rb") as handle:
        message = BytesParser(policy=policy.default).parse(handle, headersonly=True)
    sent = next((value for name, value in message.raw_items() if name.lower() == "subject"), None)
    if sent is not None and _ESCAPED.search(sent):
        # Raw 8-bit bytes: the parser keeps them as escapes and shows U+FFFD. They are read in the
        # message's own charset, else as a file's text is; encoded words among them are then decoded.
        text = _raw_header_text(sent.encode("utf-8", "surrogateescape"), message.get_content_charset())
    else:
        try:
            text = str(message.get("subject") or "")
        except (ValueError, TypeError, LookupError):  # a header beyond even the lenient parser
            return None
    words = "".join(c if c.isprintable() else " " for c in text).split()
    return " ".join(words)[:300] or None


def _raw_header_text(raw: bytes, charset: str | None) -> str:
    """A header's raw bytes as text: in `charset` (the message's) if it reads them, else as a
    file's text is; then with its encoded words decoded."""
    text = None
    if charset and _known(charset):
        with contextlib.suppress(UnicodeDecodeError):
            text = raw.decode(charset)
    text = text if text is not None else decode(raw)
    if "=?" in text:
        with contextlib.suppress(ValueError, LookupError, UnicodeError):
            # Words it leaves alone come back as raw-unicode-escape bytes of the text given.
            words = decode_header(text)
            text = "".join(
                w if isinstance(w, str) else w.decode(cs or "raw-unicode-escape", "strict") for w, cs in words
            )
    return text


def with_known_charsets(path: Path, scratch: Path) -> Path:
    """The message at `path`, or, where a text part names a charset Python has no codec for (mail
    archives write `unknown-8bit`; `utf8mb4`, `x-user-defined` are seen too), a copy in `scratch`
    with each such part read as text_encoding reads a file and stored as UTF-8: the partitioner
    failed the whole message on the label (LookupError)."""
    with path.open("rb") as handle:
        message = BytesParser(policy=policy.default).parse(handle)
    changed = False
    for part in message.walk():
        charset = part.get_content_charset()
        if part.is_multipart() or part.get_content_maintype() != "text" or charset is None or _known(charset):
            continue
        payload = part.get_payload(decode=True)
        if isinstance(part, EmailMessage):
            text = decode(payload) if isinstance(payload, bytes) else ""
            part.set_content(text, subtype=part.get_content_subtype(), charset="utf-8")
            changed = True
    if not changed:
        return path
    copy = scratch / "message.eml"
    copy.write_bytes(message.as_bytes())
    return copy


def _known(charset: str) -> bool:
    """Whether `charset` names a text codec: `zlib_codec` or `base64` name codecs of bytes, and a
    text part labelled so failed the whole message."""
    try:
        info = codecs.lookup(charset)
    except LookupError:
        return False
    return bool(getattr(info, "_is_text_encoding", True))  # what str.decode itself checks


def other_text_body(path: Path) -> str | None:
    """The body of a single-part message in a text type other than plain or HTML (git's howtos
    are mails of `text/asciidoc`), which unstructured reads as no body at all; None otherwise."""
    with path.open("rb") as handle:
        message = BytesParser(policy=policy.default).parse(handle)
    if not isinstance(message, EmailMessage) or message.is_multipart():
        return None
    if message.get_content_maintype() != "text" or message.get_content_subtype() in ("plain", "html"):
        return None
    payload = message.get_payload(decode=True)
    if not isinstance(payload, bytes):
        return None
    return payload.decode(message.get_content_charset() or "utf-8", errors="replace")

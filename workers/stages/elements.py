"""The parsed-element record every partitioner returns, whatever the file's kind."""

from __future__ import annotations

import re
from typing import Any

Element = dict[str, Any]

# A parser may hand on a code point no Unicode text holds: JSON's escape "\ud800" decodes to one.
# It cannot be written as UTF-8, so every later write of the document failed, each time its stage
# ran again, until its retries ran out with no error naming the cause.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def element(
    text: str, kind: str, page: int | None = None, label: str | None = None, depth: int | None = None
) -> Element:
    """One element: its text, its type (unstructured's category names: Title, NarrativeText,
    ListItem, Table, ...), its page and page label, and a title's depth. A lone surrogate in the
    text or the label becomes U+FFFD, as a byte that is not text does when a file is decoded."""
    return {
        "text": _unicode(text),
        "type": kind,
        "page_number": page,
        "page_label": label if label is None else _unicode(label),
        "category_depth": depth,
    }


def _unicode(text: str) -> str:
    return _LONE_SURROGATE.sub("\ufffd", text)

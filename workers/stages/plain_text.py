"""Plain text → elements by its layout: headings, paragraphs and list items, in linear time.

unstructured's text partitioner classifies each paragraph with spaCy (sentence count, part of
speech), which cost 94% of a man page's parse, and it still took option names for headings and
merged real section headings into the paragraph below. Layout says more, the way a reader sees it:
a heading is a short line without sentence punctuation that either sits left of the text it heads
(man pages, RFCs, indented outlines) or stands alone and is set apart by an underline, numbering,
capitals or title case. Heading depth follows the order in which each heading style first appears,
as reStructuredText does with its underlines, so no fixed style table is needed.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workers.stages.elements import element

_BULLET = re.compile(r"(?:[-*+•‣◦▪·]|\(?\d{1,3}[.)]|\(?[a-z][.)])\s+\S")
_NUMBERED = re.compile(r"(?:\d+\.)*\d+\.?\s+\S.*")
_UNDERLINE = re.compile(r"(=+|-+|~+|\^+|\*+)")
_SENTENCE_END = (".", ",", ";", "!", "?")
_HEADING_MAX_WORDS = 12
_HEADING_MAX_CHARS = 100
# Lines of at least this many words are prose; their usual indentation is the body's.
_PROSE_WORDS = 6


@dataclass
class _Block:
    lines: list[str] = field(default_factory=list)
    kind: str = "NarrativeText"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _heading_like(text: str) -> bool:
    words = text.split()
    if not words or len(words) > _HEADING_MAX_WORDS or len(text) > _HEADING_MAX_CHARS:
        return False
    if not (text[0].isalnum() or text[0] == "_") or not any(c.isalpha() for c in text):
        return False
    if text.endswith(":"):
        return len(words) <= 4
    return not text.endswith(_SENTENCE_END)


def _emphatic(text: str) -> str | None:
    """The heading style a stand-alone line is set in, if any: "1.2 Scope", "SCOPE", "Scope Rules"."""
    if _NUMBERED.fullmatch(text):
        number, rest = text.split(maxsplit=1)
        return f"number{number.rstrip('.').count('.')}" if _emphatic(rest) else None
    letters = [c for c in text if c.isalpha()]
    if len(letters) >= 2 and all(c.isupper() for c in letters):
        return "capitals"
    significant = [w for w in text.split() if len(w) > 3 and w[0].isalpha()]
    if text[0].isupper() and significant and all(w[0].isupper() for w in significant):
        return "title-case"
    return None


def _body_indent(lines: list[str]) -> int:
    """The indentation most prose lines share: headings sit left of it, terms and code at or right."""
    counts = Counter(_indent(line) for line in lines if len(line.split()) >= _PROSE_WORDS)
    return counts.most_common(1)[0][0] if counts else 0


class _Depths:
    """Depth by order of first appearance of each heading style."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def of(self, style: str) -> int:
        return self._seen.setdefault(style, len(self._seen))


def _page_elements(text: str, page: int | None, depths: _Depths, first_page: bool) -> list[dict[str, Any]]:
    lines = [line.rstrip() for line in text.expandtabs(8).split("\n")]
    body = _body_indent(lines)
    out: list[dict[str, Any]] = []
    block = _Block()

    def emit(text: str, kind: str, depth: int | None = None) -> None:
        out.append(element(text, kind, page, None if page is None else str(page), depth))

    def close() -> None:
        nonlocal block
        if block.lines:
            emit(" ".join(block.lines), block.kind)
        block = _Block()

    def next_nonblank(i: int) -> str | None:
        # By index, not a slice: a slice copied the rest of the document for every line.
        for j in range(i + 1, len(lines)):
            if lines[j]:
                return lines[j]
        return None

    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            close()
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        alone = not block.lines and not following.strip()
        underline = _UNDERLINE.fullmatch(following.strip()) if following.strip() else None
        if underline and not block.lines and _heading_like(stripped) and len(following.strip()) >= 3:
            emit(stripped, "Title", depths.of(f"underline{underline.group(1)[0]}"))
            lines[i + 1] = ""  # the underline is markup, not text
            continue
        if _UNDERLINE.fullmatch(stripped) and len(stripped) >= 3:
            close()  # a rule between sections
            continue
        nxt = next_nonblank(i)
        if (
            not block.lines
            and _indent(line) < body
            and _heading_like(stripped)
            and nxt is not None
            and _indent(nxt) > _indent(line)
        ):
            emit(stripped, "Title", depths.of(f"indent{_indent(line)}"))
            continue
        if alone and _heading_like(stripped):
            style = _emphatic(stripped)
            if style is None and first_page and not out:
                style = "first-line"  # a document's opening line, alone, is its title
            if style is not None:
                emit(stripped, "Title", depths.of(style))
                continue
        if _BULLET.match(stripped):
            close()
            block.kind = "ListItem"
        block.lines.append(stripped)
    close()
    return out


def text_elements(text: str) -> list[dict[str, Any]]:
    """Elements of a plain-text document; form feeds, where present, separate numbered pages."""
    depths = _Depths()
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if "\f" not in text:
        return _page_elements(text, None, depths, first_page=True)
    out: list[dict[str, Any]] = []
    for number, page in enumerate(text.split("\f"), start=1):
        out += _page_elements(page, number, depths, first_page=number == 1)
    return out

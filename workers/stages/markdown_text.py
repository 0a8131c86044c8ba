"""Markdown → elements by its own structure (CommonMark, with GitHub's tables), in linear time.

unstructured renders Markdown to HTML and then classifies each HTML element's text with its
NLP heuristics, which in a fresh process (as a parse sandbox is) costs about as much as
embedding the chunks. The structure is written in the file: `#` headings and their depth, list
items, code blocks, tables. markdown-it-py's tokens give it directly, and the file needs only
the lean parse server, whose fork is cheaper than the full server's.

Text is never lost silently: markdown-it stops reading a block nested deeper than its limit, so
a document that nests that deep is refused.
"""

from __future__ import annotations

import html
import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

from shared.errors import ErrorCode, PermanentError
from workers.stages.elements import Element, element

# Block quotes and lists nested this deep are no document a person wrote; the limit bounds the
# parser's recursion.
MAX_NESTING = 64
_FRONT_MATTER = re.compile(r"\A(?:---|\+\+\+)[ \t]*\n(.*?\n)(?:---|\.\.\.|\+\+\+)[ \t]*(?:\n|\Z)", re.S)
_FRONT_MATTER_TITLE = re.compile(r"^title\s*[:=]\s*(.+?)\s*$", re.M)
# A line of YAML or TOML metadata: `key: value`, `key = value`, `[table]`, a list entry, a
# comment or an indented continuation. Prose between two `---` rules is no front matter.
_METADATA_LINE = re.compile(r"\s*$|\s+\S|[\w.\"'-]+\s*[:=]|\[|-\s|#")
# Not "<[^>]*>": without a ">" after them, each of many "<" scanned to the end of the block.
_TAG = re.compile(r"<[^<>]*>")


def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"maxNesting": MAX_NESTING}).enable(["table", "strikethrough"])


def _inline_text(token: Token) -> str:
    """The text a reader sees: link and emphasis marks dropped, code spans and image alt text kept."""
    parts: list[str] = []
    for child in token.children or []:
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append("\n")
        elif child.type == "image":
            parts.append(_inline_text(child))
    return "".join(parts).strip()


def _front_matter(text: str) -> tuple[str, list[Element]]:
    """The body without its YAML or TOML front matter, and its `title` as the document's heading."""
    found = _FRONT_MATTER.match(text)
    if found is None or not all(_METADATA_LINE.match(line) for line in found.group(1).splitlines()):
        return text, []
    title = _FRONT_MATTER_TITLE.search(found.group(1))
    heading = [element(title.group(1).strip("'\""), "Title", depth=0)] if title else []
    return text[found.end() :], heading


def _check_nesting(tokens: list[Token]) -> None:
    # markdown-it skips the rest of a block once it is nested `maxNesting` deep: refuse instead.
    if any(token.level >= MAX_NESTING - 1 for token in tokens):
        raise PermanentError(
            f"the Markdown nests blocks deeper than {MAX_NESTING} levels", code=ErrorCode.PARSE_ERROR
        )


class _Reader:
    """Turns the token stream into elements; a method per token type it reads (`_<type>`)."""

    def __init__(self, out: list[Element]) -> None:
        self.out = out
        self.kind, self.lists = "NarrativeText", 0
        self.depth: int | None = None
        self.row: list[str] = []
        self.rows: list[str] = []

    def read(self, token: Token) -> None:
        getattr(self, f"_{token.type}", _ignore)(token)

    def _bullet_list_open(self, _: Token) -> None:
        self.lists += 1

    def _bullet_list_close(self, _: Token) -> None:
        self.lists -= 1

    _ordered_list_open, _ordered_list_close = _bullet_list_open, _bullet_list_close

    def _heading_open(self, token: Token) -> None:
        self.kind, self.depth = "Title", int(token.tag[1]) - 1

    def _paragraph_open(self, _: Token) -> None:
        self.kind, self.depth = ("ListItem" if self.lists else "NarrativeText"), None

    def _th_open(self, _: Token) -> None:
        self.kind, self.depth = "Table", None

    _td_open = _th_open

    def _inline(self, token: Token) -> None:
        content = _inline_text(token)
        if self.kind == "Table":
            self.row.append(content)
        elif content:
            self.out.append(element(content, self.kind, depth=self.depth))

    def _tr_close(self, _: Token) -> None:
        if any(self.row):
            self.rows.append(" | ".join(self.row))
        self.row = []

    def _table_close(self, _: Token) -> None:
        if self.rows:  # one element, a row a line: the chunker packs rows as it packs sentences
            self.out.append(element("\n".join(self.rows), "Table"))
        self.rows = []

    def _fence(self, token: Token) -> None:
        if token.content.strip():
            self.out.append(element(token.content.rstrip("\n"), "CodeSnippet"))

    _code_block = _fence

    def _html_block(self, token: Token) -> None:
        content = " ".join(html.unescape(_TAG.sub(" ", token.content)).split())
        if content:
            self.out.append(element(content, "NarrativeText"))


def _ignore(_: Token) -> None:
    """Closing tags, rules, blockquote marks: structure the elements do not carry."""


def markdown_elements(text: str) -> list[Element]:
    """Titles (with their depth), paragraphs, list items, code blocks and tables, in document order."""
    body, out = _front_matter(text.replace("\r\n", "\n").replace("\r", "\n"))
    tokens = _parser().parse(body)
    _check_nesting(tokens)
    reader = _Reader(out)
    for token in tokens:
        reader.read(token)
    return out

"""chunk: structure-aware splitting measured in the embedding model's own tokens.

Chunks follow sections (a title starts a new chunk) and pages, pack whole sentences up to the
token budget, overlap by trailing sentences when a section is split for size, and never exceed
the model's max sequence length: the budget leaves room for the special tokens and for the
contextual header the enrich stage prepends. Offsets point into the parsed text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from shared.admission import queue_after_chunking
from shared.embedding import HEADER_TOKEN_BUDGET, SPECIAL_TOKENS, TokenCounter, token_counter
from shared.errors import ErrorCode, RaglineError
from shared.models import Document
from workers.context import WorkerContext
from workers.stages.base import StageResult

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n+")
_PAGE_BREAK_MIN_FILL = 0.5
# A section shorter than this share of the budget shares its chunk with the next one: a chunk of
# a heading and one line (a man page's SYNOPSIS, a two-line NOTES) retrieves poorly on its own and
# costs a whole embedding. unstructured's chunk_by_title merges small sections for the same reason.
_SECTION_MIN_FILL = 0.5
# Prose takes about 4 characters a token and indented code or aligned tables several more; past
# this, text is not what the model reads well, and a chunk is cut for its size in characters.
MAX_CHARS_PER_TOKEN = 16
HEADING_CHARS = 200  # of a title, in a chunk's heading path


@dataclass
class Piece:
    """A sentence (or shorter span) of one element, with its place in the parsed text."""

    text: str
    start: int
    end: int
    tokens: int
    page_num: int | None
    page_label: str | None
    headings: tuple[str, ...]
    section_start: bool = False


@dataclass
class Chunk:
    text: str
    char_start: int
    char_end: int
    token_count: int
    page_num: int | None
    page_label: str | None
    headings: list[str] = field(default_factory=list)

    def as_dict(self, idx: int) -> dict[str, Any]:
        return {
            "chunk_idx": idx,
            "text": self.text,
            "char_start": self.char_start,
            "char_end": self.char_end,
            "token_count": self.token_count,
            "page_num": self.page_num,
            "page_label": self.page_label,
            "headings": self.headings,
        }


def body_budget(chunk_size: int, max_seq_length: int) -> int:
    """Tokens left for a chunk's own text once special tokens and the header are reserved."""
    return min(chunk_size, max_seq_length) - SPECIAL_TOKENS - HEADER_TOKEN_BUDGET


def max_chars(budget: int) -> int:
    """A chunk's most characters. The model's tokenizer reads any word over 100 characters as one
    unknown token, so a budget in tokens alone let a megabyte-long line (a CSV row, a base64 blob)
    make one chunk: too big to store, to send back or for OpenSearch to highlight."""
    return budget * MAX_CHARS_PER_TOKEN


def split_long(text: str, start: int, budget: int, counter: TokenCounter) -> list[tuple[str, int, int]]:
    """Cut a span over the budget, in tokens or characters, at token boundaries (code, tables,
    run-on text); a token longer than a chunk may be is cut where the limit falls, and so is text
    the tokenizer reads as nothing (U+FFFD, private-use or zero-width characters), which is kept."""
    limit = max_chars(budget)
    bounds: list[tuple[int, int]] = []
    cursor = 0
    for lo, hi in [*counter.offsets(text), (len(text), len(text))]:
        if lo > cursor and not text[cursor:lo].isspace():
            bounds += [(cut, min(cut + limit, lo)) for cut in range(cursor, lo, limit)]
        bounds += [(cut, min(cut + limit, hi)) for cut in range(lo, hi, limit)]
        cursor = max(cursor, hi)
    spans: list[tuple[str, int, int]] = []
    first = 0
    while first < len(bounds):
        lo = bounds[first][0]
        last = first
        while last + 1 < len(bounds) and last + 1 - first < budget and bounds[last + 1][1] - lo <= limit:
            last += 1
        # The text up to the next piece belongs to this one, when it fits.
        hi = bounds[last][1]
        if last + 1 < len(bounds) and bounds[last + 1][0] - lo <= limit:
            hi = bounds[last + 1][0]
        piece = text[lo:hi]
        if piece.strip():
            spans.append((piece, start + lo, start + hi))
        first = last + 1
    return spans


def _sentences(text: str, start: int) -> list[tuple[str, int, int]]:
    spans: list[tuple[str, int, int]] = []
    cursor = 0
    for match in _SENTENCE_END.finditer(text):
        if match.start() > cursor:
            spans.append((text[cursor : match.start()], start + cursor, start + match.start()))
        cursor = match.end()
    if cursor < len(text):
        spans.append((text[cursor:], start + cursor, start + len(text)))
    return [span for span in spans if span[0].strip()]


def pieces_of(elements: list[dict[str, Any]], budget: int, counter: TokenCounter) -> tuple[str, list[Piece]]:
    """The parsed text (elements joined by blank lines) and its sentence pieces with headings."""
    parts: list[str] = []
    spans_of: list[list[tuple[str, int, int]]] = []
    offset = 0
    for element in elements:
        spans_of.append(_sentences(element["text"], offset))
        parts.append(element["text"])
        offset += len(element["text"]) + 2
    # One tokenizer call for the whole document: a call per element cost more than its tokens.
    counts = iter(counter.count([span[0] for spans in spans_of for span in spans]))
    pieces: list[Piece] = []
    headings: list[tuple[int, str]] = []
    limit = max_chars(budget)
    for element, spans in zip(elements, spans_of, strict=True):
        text = element["text"]
        page_num, page_label = element.get("page_number"), element.get("page_label")
        is_title = element.get("type") == "Title"
        if is_title:
            depth = int(element.get("category_depth") or 0)
            headings = [h for h in headings if h[0] < depth] + [(depth, _heading(text))]
        for index, span in enumerate(spans):
            count = next(counts)
            fits = count <= budget and len(span[0]) <= limit
            sub_spans = [span] if fits else split_long(span[0], span[1], budget, counter)
            sub_counts = [count] if fits else counter.count([s[0] for s in sub_spans])
            for sub, sub_count in zip(sub_spans, sub_counts, strict=True):
                pieces.append(
                    Piece(
                        text=sub[0],
                        start=sub[1],
                        end=sub[2],
                        tokens=sub_count,
                        page_num=page_num,
                        page_label=page_label,
                        headings=tuple(h[1] for h in headings),
                        # Headings alone before an overflow give way to the text after them when
                        # its heading path holds them (`pack`): a title too long for that is text.
                        section_start=is_title
                        and index == 0
                        and len(sub_spans) == 1
                        and len(text) <= HEADING_CHARS,
                    )
                )
    return "\n\n".join(parts), pieces


def _heading(title: str) -> str:
    """A title as a chunk's heading path holds it."""
    return " ".join(title.split())[:HEADING_CHARS]


def _main_headings(pieces: list[Piece]) -> tuple[str, ...]:
    """The heading path of the section that holds most of a chunk's tokens."""
    weight: dict[tuple[str, ...], int] = {}
    for piece in pieces:
        weight[piece.headings] = weight.get(piece.headings, 0) + piece.tokens
    return max(weight, key=lambda headings: weight[headings])


def pack(pieces: list[Piece], parsed: str, budget: int, overlap: int, counter: TokenCounter) -> list[Chunk]:
    """Greedily pack pieces into chunks of at most `budget` tokens."""
    chunks: list[Chunk] = []
    current: list[Piece] = []
    size = 0
    limit = max_chars(budget)

    def close(following: Piece | None = None) -> None:
        """End the chunk of `current`. Headings alone are left out when the piece that follows
        them holds each in its heading path and fills half a chunk, so that no other section
        shares its chunk and that path is the chunk's; sibling headings, or the last ones, stay."""
        if not current:
            return
        if (
            following is not None
            and following.tokens >= budget * _SECTION_MIN_FILL
            and all(p.section_start for p in current)
            and all(_heading(p.text) in following.headings for p in current)
        ):
            return
        text = parsed[current[0].start : current[-1].end]
        chunks.append(
            Chunk(
                text=text,
                char_start=current[0].start,
                char_end=current[-1].end,
                token_count=0,
                page_num=current[0].page_num,
                page_label=current[0].page_label,
                headings=list(_main_headings(current)),
            )
        )

    for piece in pieces:
        page_changed = bool(current) and piece.page_num != current[-1].page_num
        # A small section shares its chunk with the next, unless the next one also starts a page.
        section_break = (
            piece.section_start
            and current
            and not all(p.section_start for p in current)
            and (size >= budget * _SECTION_MIN_FILL or page_changed)
        )
        # +1: joining two pieces can cost a token at the seam.
        if section_break or (page_changed and size >= budget * _PAGE_BREAK_MIN_FILL):
            close(piece)
            current, size = [], 0
        elif current and (size + piece.tokens + 1 > budget or piece.end - current[0].start > limit):
            close(piece)
            carried: list[Piece] = []
            carried_size = 0
            for previous in reversed(current):
                # A new section starts clean: the tail of the last one is not its context.
                if (
                    piece.section_start
                    or carried_size + previous.tokens > overlap
                    or previous.section_start
                    or piece.end - previous.start > limit
                ):
                    break
                carried.insert(0, previous)
                carried_size += previous.tokens + 1
            current, size = carried, carried_size
        current.append(piece)
        size += piece.tokens + 1
    close()
    counts = counter.count([chunk.text for chunk in chunks]) if chunks else []
    for chunk, count in zip(chunks, counts, strict=True):
        chunk.token_count = count
    return [chunk for chunk in chunks if _fits(chunk, budget, limit)] + [
        piece_chunk
        for chunk in chunks
        if not _fits(chunk, budget, limit)
        for piece_chunk in _resplit(chunk, budget, counter)
    ]


def _fits(chunk: Chunk, budget: int, limit: int) -> bool:
    return chunk.token_count <= budget and len(chunk.text) <= limit


def _resplit(chunk: Chunk, budget: int, counter: TokenCounter) -> list[Chunk]:
    # Text joined across a seam can tokenize longer than its parts: cut it at token boundaries.
    out = []
    for text, start, end in split_long(chunk.text, chunk.char_start, budget, counter):
        out.append(
            Chunk(
                text,
                start,
                end,
                counter.count([text])[0],
                chunk.page_num,
                chunk.page_label,
                list(chunk.headings),
            )
        )
    return out


def chunk_elements(
    elements: list[dict[str, Any]], chunk_size: int, overlap: int, counter: TokenCounter
) -> tuple[str, list[dict[str, Any]]]:
    """Parsed text and the chunk dicts, in document order."""
    budget = body_budget(chunk_size, counter.max_seq_length)
    parsed, pieces = pieces_of(elements, budget, counter)
    chunks = pack(pieces, parsed, budget, min(overlap, budget // 2), counter)
    chunks.sort(key=lambda c: c.char_start)
    return parsed, [chunk.as_dict(idx) for idx, chunk in enumerate(chunks)]


def run(ctx: WorkerContext, doc: Document, parsed: dict[str, Any]) -> StageResult:
    kb = ctx.registry.get_kb(doc.tenant_id, doc.kb_id)
    counter = token_counter(ctx.settings.embedding)
    text, chunks = chunk_elements(
        parsed["elements"], kb.settings.chunk_size, kb.settings.chunk_overlap, counter
    )
    if not chunks:
        raise RaglineError("the document holds no text to index", code=ErrorCode.EMPTY_DOCUMENT)
    queue = queue_after_chunking(ctx.settings, doc.queue, len(chunks))
    return StageResult(
        artifact={**parsed, "text": text, "chunks": chunks},
        updates={"chunk_count": len(chunks), **({"queue": queue} if queue != doc.queue else {})},
    )

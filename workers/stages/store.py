"""store: bulk-index the chunks of this version under a new generation, then retire the old one.

Chunk `_id`s are deterministic (document, generation, index): a redelivered store overwrites
instead of duplicating. Every item of every bulk response is checked; failed items are retried
with backoff when the failure is transient. The registry flips `active_generation` (in the
runner's write that marks the document ready) before the old generation's chunks are deleted,
so a reader never finds the document without chunks.

A document's first chunk also carries the whole document's fields: its text and the normalized
mean of its chunk vectors, which the document ranking arms search (shared/search/queries.py).

Writes go through the KB's alias (and, while a reembed runs, its "next" alias), never to a physical
name: `require_alias` means a write can never create an index. After writing, the store resolves
the aliases again; if a reembed moved them meanwhile it writes again to where they point now,
re-encoding for that index's model. So a document stored during a reembed is never lost, and a
chunk never sits in an index with another model's vector.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np

from shared.embedding import embedded_text, encoder, for_model, indexed_vector
from shared.errors import ErrorCode, PermanentError, RaglineError, TransientError
from shared.models import Document, utcnow
from shared.search.chunk_index import Sources, bulk_index, delete_generation, delete_generations, refresh
from shared.search.metadata import with_metadata_fields
from shared.search.placement import Placement, write_aliases, write_targets
from shared.search.schema import chunks_alias
from workers import metrics
from workers.context import WorkerContext
from workers.stages.base import StageResult
from workers.stages.embed import decode_b64

# BM25 length normalization already discounts long documents; past this, more text only costs.
DOCUMENT_TEXT_CHARS = 1_000_000


def chunk_doc_id(doc: Document, generation: int, chunk_idx: int) -> str:
    key = f"{doc.tenant_id}/{doc.kb_id}/{doc.doc_id}/g{generation}/{chunk_idx}"
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def chunk_source(
    doc: Document, generation: int, chunk: dict[str, Any], title: str, language: str
) -> dict[str, Any]:
    source = {
        "tenant_id": doc.tenant_id,
        "kb_id": doc.kb_id,
        "doc_id": doc.doc_id,
        "generation": generation,
        "chunk_idx": chunk["chunk_idx"],
        "chunk_id": f"{doc.doc_id}#{chunk['chunk_idx']}",
        "text": chunk["text"],
        "title": title,
        "headings": chunk["headings"],
        "context": chunk.get("context"),
        "keywords": chunk.get("keywords", []),
        "language": language,
        "page_num": chunk.get("page_num"),
        "page_label": chunk.get("page_label"),
        "char_start": chunk.get("char_start"),
        "char_end": chunk.get("char_end"),
        "token_count": chunk.get("token_count"),
        "source_uri": doc.source_uri,
        "filename": doc.filename,
        "mime_type": doc.mime_type,
        "created_at": utcnow().isoformat(),
        "embedding": decode_b64(chunk["embedding_b64"]),
    }
    return with_metadata_fields(source, doc.metadata)


def mean_direction(vectors: Sequence[Sequence[float]]) -> list[float] | None:
    """The normalized mean of `vectors`; None when it is zero (cosine similarity refuses it)."""
    mean = np.mean(np.asarray(vectors, dtype=np.float64), axis=0)
    norm = float(np.linalg.norm(mean))
    return indexed_vector(mean / norm) if norm > 0 else None


def document_fields(texts: Sequence[str], vectors: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The whole-document fields: its chunks' text (capped) and their normalized mean vector."""
    fields: dict[str, Any] = {"document_text": "\n\n".join(texts)[:DOCUMENT_TEXT_CHARS]}
    direction = mean_direction(vectors)
    if direction is not None:
        fields["document_embedding"] = direction
    return fields


def with_document_fields(sources: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """`sources` (a document's chunks, first chunk first) with the document's fields on the first."""
    if not sources:
        return sources
    fields = document_fields([s["text"] for _, s in sources], [s["embedding"] for _, s in sources])
    first_id, first = sources[0]
    return [(first_id, {**first, **fields}), *sources[1:]]


MAX_MOVES = 5  # alias moves survived in one store; a reembed makes at most one


@dataclass(frozen=True)
class _Stored:
    """A document of the batch: its position there, its chunks as indexed, its stage input."""

    position: int
    doc: Document
    sources: Sources
    embedded: dict[str, Any]


def run_batch(
    ctx: WorkerContext, items: list[tuple[Document, dict[str, Any]]]
) -> list[StageResult | RaglineError]:
    """Store several documents (an embedding batch handed on together) with one refresh.

    A refresh per document made a Lucene segment, HNSW graphs included, per document, and the
    refresh cost OpenSearch more CPU than the bulk itself. Documents of one KB go in the same bulk
    requests; a chunk the index rejects fails only its own document.
    """
    results: list[StageResult | RaglineError] = []
    by_kb: dict[tuple[str, str], list[_Stored]] = {}
    for position, (doc, embedded) in enumerate(items):
        by_kb.setdefault((doc.tenant_id, doc.kb_id), []).append(
            _Stored(position, doc, _sources(doc, embedded), embedded)
        )
        results.append(_stored(ctx, doc, len(embedded["chunks"]), len(items)))
    written: set[str] = set()
    for (tenant_id, kb_id), docs in by_kb.items():
        for position, error in _write_kb(ctx, tenant_id, kb_id, docs, written).items():
            results[position] = error
    for alias in sorted(written):
        refresh(ctx.client, alias)
    return results


def _sources(doc: Document, embedded: dict[str, Any]) -> Sources:
    generation, title = doc.content_version, embedded["title"]
    language = embedded.get("language", "en")
    return with_document_fields(
        [
            (chunk_doc_id(doc, generation, c["chunk_idx"]), chunk_source(doc, generation, c, title, language))
            for c in embedded["chunks"]
        ]
    )


def _stored(ctx: WorkerContext, doc: Document, chunk_count: int, batch_documents: int) -> StageResult:
    generation = doc.content_version

    def retire_old() -> None:
        aliases = write_aliases(ctx.client, ctx.settings, doc.tenant_id, doc.kb_id)
        delete_generations(ctx.client, aliases, doc.tenant_id, doc.kb_id, doc.doc_id, keep=generation)

    def drop_written() -> None:
        # Wherever the KB's aliases pointed: they are gone with the KB.
        anywhere = f"{chunks_alias(ctx.settings)}-*"
        delete_generation(ctx.client, anywhere, doc.tenant_id, doc.kb_id, doc.doc_id, generation)

    return StageResult(
        artifact=None,
        updates={
            "active_generation": generation,
            "chunk_count": chunk_count,
            "stats": {**doc.stats, "store": {"batch_documents": batch_documents}},
        },
        # A first version has no older generation to retire: skip that delete-by-query (an alias
        # lookup and a scroll that matches nothing), a cost paid on every document of a first load.
        after=retire_old if generation > 1 else None,
        undo=drop_written,
    )


def _write_kb(
    ctx: WorkerContext,
    tenant_id: str,
    kb_id: str,
    docs: list[_Stored],
    written: set[str],
) -> dict[int, RaglineError]:
    """Write one KB's documents wherever its aliases point, again if a reembed moves them meanwhile;
    returns the failures by position. `written` collects the aliases to refresh."""
    failed = _changed_records(ctx, tenant_id, kb_id, docs)
    done: list[str] = []
    for _ in range(MAX_MOVES):
        targets = write_targets(ctx.client, ctx.settings, tenant_id, kb_id)
        if [t.index for t in targets] == done:
            return failed
        for target in targets:
            pending = [d for d in docs if d.position not in failed]
            failed |= _write(ctx, tenant_id, kb_id, target, pending)
            written.add(target.alias)
        done = [t.index for t in targets]
    moving = TransientError("the knowledge base's chunk index kept moving")
    return {d.position: moving for d in docs}


def _changed_records(
    ctx: WorkerContext, tenant_id: str, kb_id: str, docs: list[_Stored]
) -> dict[int, RaglineError]:
    """The documents whose record is no longer the version in work, by position: their chunks are
    not written. The KB may have been deleted meanwhile, created again and the same document
    uploaded anew: its first version has the same chunk ids, and this store would fill the new
    KB with the old text. (A record that goes while the bulk runs is the hand-over's `undo`.)"""
    keys = [(kb_id, d.doc.doc_id) for d in docs]
    records = ctx.registry.doc_fields(tenant_id, keys, ["created_at", "content_version"])
    return {
        d.position: RaglineError(
            "the document was deleted or replaced while it was stored", code=ErrorCode.CONFLICT
        )
        for d, record in zip(docs, records, strict=True)
        if record is None
        or record.get("content_version") != d.doc.content_version
        or datetime.fromisoformat(record["created_at"]) != d.doc.created_at
    }


def _write(
    ctx: WorkerContext, tenant_id: str, kb_id: str, target: Placement, docs: list[_Stored]
) -> dict[int, RaglineError]:
    """Write the documents' chunks through `target`'s alias, with vectors of its index's model."""
    batch = [(d.position, _for_target(ctx, target, d)) for d in docs]
    try:
        bulk_index(
            ctx.client,
            target.alias,
            [s for _, sources in batch for s in sources],
            require_alias=True,
            timed=metrics.bulk_request,
        )
        return {}
    except PermanentError as error:
        # The alias moved between resolving and writing (to an index of another dimension, or
        # away): the caller resolves again. A rejection with the aliases in place is real.
        if target not in write_targets(ctx.client, ctx.settings, tenant_id, kb_id):
            return {}
        if len(batch) == 1:
            return {batch[0][0]: error}
    failed: dict[int, RaglineError] = {}
    for position, sources in batch:  # which documents the index rejects: one bulk each
        try:
            bulk_index(ctx.client, target.alias, sources, require_alias=True, timed=metrics.bulk_request)
        except PermanentError as error:
            failed[position] = error
    return failed


def _for_target(ctx: WorkerContext, target: Placement, stored: _Stored) -> Sources:
    """The document's chunks with vectors of `target`'s model (a reembed's new index has another)."""
    model = stored.embedded.get("embedding_model", ctx.settings.embedding.model)
    if target.model == model:
        return stored.sources
    other = encoder(for_model(ctx.settings.embedding, target.model))
    with metrics.model_cpu():
        vectors = other.encode([embedded_text(c) for c in stored.embedded["chunks"]])
    return with_document_fields(
        [
            (i, {**s, "embedding": indexed_vector(v)})
            for (i, s), v in zip(stored.sources, vectors, strict=True)
        ]
    )

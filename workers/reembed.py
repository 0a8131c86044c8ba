"""Moving a knowledge base to another embedding model while searches keep answering.

1. The API marked the KB (`reembed` in its record) and sent this task.
2. A new index for the model is created, `<prefix>-chunks-<model>-kb-<hash>-v<n>`, carrying the
   KB's "next" alias. From then on the store stage writes new documents to both indexes.
3. The KB's chunks are copied from the index its alias names, page by page from one scroll
   snapshot, re-encoded from their stored text (no re-parsing). Only each document's active
   generation is copied, checked against the registry right before each page is written. The
   scroll runs in document order, so a document's mean vector (kept on its first chunk for the
   document ranking arms) is recomputed from the new vectors when its last chunk is encoded.
4. One `_aliases` call moves the KB's alias onto the new index and drops the "next" alias:
   searches switch atomically (shared/search/placement.py). The KB record then names the model.
5. After a grace period, in which searches that resolved the old index finish, documents changed
   during the copy have their retired generations swept from the new index, and the old index is
   dropped (from the shared index of the default model, only the KB's chunks are deleted).

Ingest is never blocked: a document stored meanwhile lands in both indexes, and the store stage
re-checks the aliases after writing, so a swap under its feet only makes it write again
(workers/stages/store.py). A redelivered task starts over on the same new index; ids are
deterministic, so copying twice only overwrites.
"""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import timedelta
from typing import Any

import numpy as np

from shared.embedding import (
    Encoder,
    ModelUnavailable,
    embedded_text,
    encoder,
    for_model,
    indexed_vector,
    servable_models,
)
from shared.models import DocStatus, KnowledgeBase
from shared.search.chunk_index import (
    bulk_index,
    delete_generations,
    delete_kb_chunks,
    kb_chunk_pages,
    refresh,
)
from shared.search.metadata import stored_metadata, with_metadata_fields
from shared.search.placement import (
    aliased,
    kb_alias,
    next_alias,
    next_own_index,
    own_indexes,
    resolve_one,
    swap_alias,
)
from shared.search.schema import chunk_index_body, create_index, drop_index
from workers import metrics
from workers.context import WorkerContext
from workers.stages.store import mean_direction

log = logging.getLogger(__name__)

PAGE = 64  # chunks encoded and written per step
SWAP_GRACE_S = 10.0  # the old index outlives the swap by this long: in-flight searches finish


def reembed(ctx: WorkerContext, tenant_id: str, kb_id: str, model: str) -> dict[str, Any]:
    """Run the reembed the KB record asks for; on failure, undo what is not yet live and say why."""
    kb = ctx.registry.get_kb(tenant_id, kb_id)
    if kb.reembed is None or kb.reembed.model != model:
        log.info("reembed of %s to %s is no longer asked for", kb_id, model)
        return {}
    target: str | None = None
    try:
        if model not in servable_models(ctx.settings.embedding):
            # The API refuses such a model; a task naming one was not sent by it.
            raise ModelUnavailable("the model is not one this server knows")
        model_encoder = encoder(for_model(ctx.settings.embedding, model))
        current = resolve_one(ctx.client, ctx.settings, tenant_id, kb_id)
        target = _target_index(ctx, kb, model, model_encoder.dimension)
        copied = _copy(ctx, kb, current.index, model_encoder)
        _swap(ctx, kb, current.index, target)
        started_at = kb.reembed.started_at
        dimension = model_encoder.dimension

        def finish(record: KnowledgeBase) -> KnowledgeBase:
            if record.reembed is not None and record.reembed.model == model:
                record.embedding_model, record.embedding_dimension, record.reembed = model, dimension, None
            return record

        kb = ctx.registry.update_kb(tenant_id, kb_id, finish)
        time.sleep(SWAP_GRACE_S)
        swept = _sweep(ctx, kb, started_at)
        _retire(ctx, kb, current.index, target)
    except Exception as error:
        _abandon(ctx, tenant_id, kb_id, model, target, error)
        raise
    report = {"copied": copied, "swept": swept, "index": target, "old_index": current.index}
    log.info("reembed of %s to %s done: %s", kb_id, model, report)
    return report


def _target_index(ctx: WorkerContext, kb: KnowledgeBase, model: str, dimension: int) -> str:
    """The index the "next" alias names, created on first delivery and reused on redelivery."""
    following = next_alias(ctx.settings, kb.tenant_id, kb.kb_id)
    existing = aliased(ctx.client, [following]).get(following)
    if existing is not None:
        return existing
    name = next_own_index(ctx.client, ctx.settings, kb.tenant_id, kb.kb_id, model)
    create_index(ctx.client, name, chunk_index_body(ctx.settings, model, dimension, {following: {}}))
    return name


def _copy(ctx: WorkerContext, kb: KnowledgeBase, source_index: str, model_encoder: Encoder) -> int:
    """Re-encode every active chunk of the KB into the "next" alias; returns the count written."""
    following = next_alias(ctx.settings, kb.tenant_id, kb.kb_id)
    copied = 0
    held = _HeldDocument()
    pages = kb_chunk_pages(ctx.client, source_index, kb.tenant_id, kb.kb_id, PAGE)
    with contextlib.closing(pages):
        for hits in pages:
            with metrics.model_cpu():
                vectors = model_encoder.encode([embedded_text(h["_source"]) for h in hits])
            active = ctx.registry.active_generations(
                kb.tenant_id, kb.kb_id, {h["_source"]["doc_id"] for h in hits}
            )
            docs: list[tuple[str, dict[str, Any]]] = []
            for hit, vector in zip(hits, vectors, strict=True):
                if active.get(hit["_source"]["doc_id"]) == hit["_source"]["generation"]:
                    # Chunks of an earlier version's index get the typed metadata fields here.
                    source = with_metadata_fields(hit["_source"], stored_metadata(hit["_source"]))
                    docs += held.take(hit["_id"], {**source, "embedding": indexed_vector(vector)})
            bulk_index(ctx.client, following, docs, require_alias=True, timed=metrics.bulk_request)
            copied += len(docs)
    last = held.release()
    bulk_index(ctx.client, following, last, require_alias=True, timed=metrics.bulk_request)
    copied += len(last)
    refresh(ctx.client, following)
    return copied


class _HeldDocument:
    """The first chunk of the document being copied, held until the document's mean vector is
    complete: chunks arrive in document order, so the next document's first chunk completes it."""

    def __init__(self) -> None:
        self.key: tuple[str, int] | None = None
        self.first: tuple[str, dict[str, Any]] | None = None
        self.total: np.ndarray[Any, Any] | None = None
        self.count = 0

    def take(self, chunk_id: str, source: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """Add a chunk; returns the chunks now ready to write."""
        key = (source["doc_id"], int(source["generation"]))
        ready = self.release() if key != self.key else []
        self.key = key
        vector = np.asarray(source["embedding"], dtype=np.float64)
        self.total = vector if self.total is None else self.total + vector
        self.count += 1
        if "document_text" in source:
            self.first = (chunk_id, source)
        else:
            ready.append((chunk_id, source))
        return ready

    def release(self) -> list[tuple[str, dict[str, Any]]]:
        """The held first chunk with its document's new mean vector; the holder starts afresh."""
        first, total, count = self.first, self.total, self.count
        self.key, self.first, self.total, self.count = None, None, None, 0
        if first is None or total is None:
            return []
        chunk_id, source = first
        direction = mean_direction([(total / count).tolist()])
        return [(chunk_id, source if direction is None else {**source, "document_embedding": direction})]


def _swap(ctx: WorkerContext, kb: KnowledgeBase, old: str, new: str) -> None:
    """Point the KB's alias at the new index and retire the "next" alias, in one atomic call."""
    alias = kb_alias(ctx.settings, kb.tenant_id, kb.kb_id)
    actions = [
        {"remove": {"index": old, "alias": alias}},
        {"remove": {"index": new, "alias": next_alias(ctx.settings, kb.tenant_id, kb.kb_id)}},
        {"add": {"index": new, "alias": alias}},
    ]
    swap_alias(ctx.client, actions)


def _sweep(ctx: WorkerContext, kb: KnowledgeBase, since: Any) -> int:
    """Remove from the new index generations retired while the copy ran (the copy may have
    written a page just before its document was deleted or replaced)."""
    alias = kb_alias(ctx.settings, kb.tenant_id, kb.kb_id)
    swept = 0
    for record in ctx.registry.settled_since(kb.tenant_id, kb.kb_id, since - timedelta(seconds=5)):
        keep = None if record["status"] == DocStatus.DELETED.value else record.get("active_generation")
        swept += delete_generations(ctx.client, alias, kb.tenant_id, kb.kb_id, record["doc_id"], keep)
    return swept


def _retire(ctx: WorkerContext, kb: KnowledgeBase, old: str, new: str) -> None:
    """Drop the old index if it was the KB's own; from the shared index, delete the KB's chunks."""
    own = own_indexes(ctx.client, ctx.settings, kb.tenant_id, kb.kb_id)
    if old in own and old != new:
        drop_index(ctx.client, old)
        return
    delete_kb_chunks(ctx.client, old, kb.tenant_id, kb.kb_id)


def _abandon(
    ctx: WorkerContext, tenant_id: str, kb_id: str, model: str, target: str | None, error: Exception
) -> None:
    """Undo a reembed that failed before its swap (the new index is not live); record why."""
    log.exception("reembed of %s failed", kb_id, exc_info=error)
    alias = kb_alias(ctx.settings, tenant_id, kb_id)
    if target is not None and aliased(ctx.client, [alias]).get(alias) != target:
        drop_index(ctx.client, target, missing_ok=True)
    reason = f"{type(error).__name__}: {error}"[:500]

    def give_up(record: KnowledgeBase) -> KnowledgeBase:
        if record.reembed is not None and record.reembed.model == model:
            record.reembed, record.reembed_error = None, reason
        return record

    ctx.registry.update_kb(tenant_id, kb_id, give_up)

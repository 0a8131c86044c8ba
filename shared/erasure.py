"""What a delete removes: every byte of a document that no other live version needs.

A document leaves chunks in the search indexes, stage artifacts (the parsed text among them),
its uploaded bytes in the blob store, and entries in the caches derived from its text (its
chunks' vectors, its PII findings: shared/text_caches.py). Deleting it removes all four; a
record left in `deleting` (the process died half way) is finished by the reconciler the same
way, since each step is idempotent. The bytes are content-addressed and shared by every record
with the same hash, in any tenant: they go only when no live record (any status but `deleting`
and `deleted`) has that hash.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
from opensearchpy import OpenSearch

from shared import text_caches
from shared.blobs import BlobStore, version_artifact_keys
from shared.config import Settings
from shared.models import DocStatus, Document, utcnow
from shared.registry import Conflict, Registry, Versioned
from shared.search.chunk_index import delete_generations
from shared.search.placement import write_aliases

log = logging.getLogger(__name__)

_BATCH = 500  # blobs checked in one search, under their stripes' locks


def release_blobs(registry: Registry, blobs: BlobStore, sha256s: Iterable[str]) -> set[str]:
    """Remove the blobs no live record needs; returns those removed. An empty hash (a document by
    URL not fetched yet) names no blob."""
    wanted, removed = sorted(set(sha256s) - {""}), set()
    for first in range(0, len(wanted), _BATCH):
        batch = wanted[first : first + _BATCH]
        removed |= blobs.remove_unused(batch, registry.live_hashes)
    return removed


def release_blob(registry: Registry, blobs: BlobStore, sha256: str) -> bool:
    """Remove the blob unless a live record needs it; returns whether it is gone."""
    return bool(release_blobs(registry, blobs, [sha256]))


def drop_artifacts(blobs: BlobStore, doc: Document) -> None:
    """Every stage artifact of every version of the document's record up to its current one."""
    versions = range(1, doc.content_version + 1)
    blobs.drop_artifacts(version_artifact_keys(doc, versions))


def drop_kb_documents(
    registry: Registry, blobs: BlobStore, caches: redis.Redis, tenant_id: str, kb_id: str, *, final: bool
) -> list[Document]:
    """Delete a knowledge base's document records, then their artifacts and the bytes no live
    record needs; returns the documents deleted (`Registry.delete_kb_records` says what `final`
    changes)."""
    fields = ["tenant_id", "kb_id", "doc_id", "created_at", "content_version", "content_hash", "file_size"]
    doomed = registry.delete_kb_records(tenant_id, kb_id, fields, final=final)
    forget_documents(registry, blobs, caches, doomed)
    return doomed


def forget_documents(registry: Registry, blobs: BlobStore, caches: redis.Redis, docs: list[Document]) -> None:
    """After their records are gone (a knowledge base deleted): their artifacts, their cache
    entries, and their bytes where no live record needs them."""
    for doc in docs:
        drop_artifacts(blobs, doc)
    # A retried KB delete no longer finds these records: each goes even where the other fails.
    try:
        release_blobs(registry, blobs, [doc.content_hash for doc in docs])
    finally:
        text_caches.forget(caches, docs)


def finish_delete(
    settings: Settings,
    registry: Registry,
    client: OpenSearch,
    blobs: BlobStore,
    caches: redis.Redis,
    deleting: Versioned,
) -> Document:
    """Remove a `deleting` document's chunks, artifacts, cache entries and bytes, then mark it
    `deleted`.

    The record stays `deleting` until all of it is gone, so a crash on the way leaves it for the
    reconciler. If the record moved on meanwhile (uploaded again), the newer state wins and is
    returned; what was removed belonged to the deleted versions only.
    """
    doc = deleting.doc
    aliases = write_aliases(client, settings, doc.tenant_id, doc.kb_id)
    delete_generations(client, aliases, doc.tenant_id, doc.kb_id, doc.doc_id, keep=None)
    drop_artifacts(blobs, doc)
    text_caches.forget(caches, [doc])
    release_blob(registry, blobs, doc.content_hash)
    done = doc.model_copy(deep=True)
    done.status = DocStatus.DELETED
    done.active_generation = None
    done.chunk_count = 0
    done.claimed_by = None
    done.lease_until = None
    done.transitions = [*done.transitions, {"status": DocStatus.DELETED.value, "at": utcnow().isoformat()}]
    try:
        return registry.replace_doc(deleting, done).doc
    except Conflict:
        log.info("document %s/%s changed while it was deleted; the newer state stands", doc.kb_id, doc.doc_id)
        current = registry.get_doc(doc.tenant_id, doc.kb_id, doc.doc_id)
        return current.doc if current is not None else done

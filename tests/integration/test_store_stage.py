"""The store stage writes a document's chunks only while its record is the version in work: a
store that outlived its KB (deleted, created again, the same document uploaded anew) wrote the
old text under the new document's chunk ids, and search showed it in the new KB."""

from __future__ import annotations

import time
from typing import Any

from shared.errors import ErrorCode, RaglineError
from shared.ingest import StageRef
from shared.models import Document, Stage
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import chunks_of, new_kb
from workers import runner
from workers.stages import embed, store


def _embedded(services: Services, doc: Document, text: str) -> dict[str, Any]:
    chunks = {"chunks": [{"chunk_idx": 0, "text": text, "headings": [], "context": "notes"}]}
    (result,) = embed._run_model_batch(services, services.settings.embedding.model, [(doc, chunks)])
    assert not isinstance(result, RaglineError)
    return {**result.artifact, "title": "notes", "language": "en"}


def _record(registry: Registry, tenant_id: str, kb_id: str) -> Document:
    doc = Document(
        tenant_id=tenant_id, kb_id=kb_id, doc_id="x.txt", filename="x.txt", content_hash="h", file_size=1
    )
    return registry.create_doc(doc).doc


def test_a_store_writes_nothing_for_a_record_created_anew_meanwhile(services: Services) -> None:
    registry = services.registry
    kb = new_kb(registry)
    old = _record(registry, kb.tenant_id, kb.kb_id)
    embedded = _embedded(services, old, "The old text of the deleted knowledge base.")
    registry.drop_doc(old)  # its KB deleted; the KB created again and the same file uploaded anew
    time.sleep(0.01)
    new = _record(registry, kb.tenant_id, kb.kb_id)
    assert (new.content_version, new.created_at) != (old.content_version, old.created_at)

    (result,) = store.run_batch(services, [(old, embedded)])

    assert isinstance(result, RaglineError)
    assert result.code == ErrorCode.CONFLICT
    assert chunks_of(services.client, services.settings, kb, "x.txt") == []
    (current,) = store.run_batch(services, [(new, _embedded(services, new, "The new text."))])
    assert not isinstance(current, RaglineError)
    assert [c["text"] for c in chunks_of(services.client, services.settings, kb, "x.txt")] == [
        "The new text."
    ]


def test_the_old_documents_failure_leaves_the_new_document_of_the_same_id(services: Services) -> None:
    """The store's CONFLICT above is recorded as the old document's failure: its write conflicts,
    and the record read back, the new document at the same version, was failed instead."""
    registry = services.registry
    kb = new_kb(registry)
    claimed = registry.create_doc(
        Document(tenant_id=kb.tenant_id, kb_id=kb.kb_id, doc_id="x.txt", content_hash="h", file_size=1)
    )
    registry.drop_doc(claimed.doc)
    time.sleep(0.01)
    new = _record(registry, kb.tenant_id, kb.kb_id)
    ref = StageRef(kb.tenant_id, kb.kb_id, "x.txt", 1, Stage.STORE)
    error = RaglineError("the document was deleted or replaced while it was stored", code=ErrorCode.CONFLICT)

    runner._finish_failed(services, ref, error, claimed)

    after = registry.require_doc(kb.tenant_id, kb.kb_id, "x.txt").doc
    assert (after.status, after.error) == (new.status, None)

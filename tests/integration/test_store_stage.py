"""The store stage writes a document's chunks only while its record is the version in work: a
store that outlived its KB (deleted, created again, the same document uploaded anew) wrote the
old text under the new document's chunk ids, and search showed it in the new KB."""

from __future__ import annotations

import time
from typing import Any

from shared.errors import ErrorCode, RaglineError
from shared.models import Document
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import chunks_of, new_kb
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

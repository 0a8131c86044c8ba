"""A knowledge base's deletion sweeps its document records: workers that keep rewriting some of
them must not make it fail half done (it answered 409 after the KB's chunks and part of its records
were gone), and it returns exactly the records it deleted, so their artifacts and bytes go too."""

from __future__ import annotations

import threading

import pytest

from shared import registry as registry_module
from shared.models import Document, KnowledgeBase
from shared.registry import Conflict, Registry
from tests.integration.helpers import new_kb

FIELDS = ["tenant_id", "kb_id", "doc_id", "content_version", "content_hash", "file_size"]
WRITERS = 4


class Rewriter(threading.Thread):
    """Rewrites one record, as fast as it can, until the record is gone."""

    def __init__(self, registry: Registry, kb: KnowledgeBase, doc_id: str) -> None:
        super().__init__(daemon=True)
        self.registry, self.kb, self.doc_id = registry, kb, doc_id
        self.writes = 0
        self.wrote = threading.Event()

    def run(self) -> None:
        while (found := self.registry.get_doc(self.kb.tenant_id, self.kb.kb_id, self.doc_id)) is not None:
            changed = found.doc.model_copy(update={"content_hash": f"h{self.writes}"})
            try:
                self.registry.replace_doc(found, changed)
            except Conflict:  # the sweep deleted it between the read and the write
                continue
            self.writes += 1
            self.wrote.set()


def _records(registry: Registry, kb: KnowledgeBase, count: int) -> list[str]:
    ids = [f"d{n:03d}.txt" for n in range(count)]
    for doc_id in ids:
        registry.create_doc(
            Document(
                tenant_id=kb.tenant_id,
                kb_id=kb.kb_id,
                doc_id=doc_id,
                filename=doc_id,
                content_hash="h",
                file_size=1,
            )
        )
    return ids


def _left(registry: Registry, kb: KnowledgeBase) -> list[str]:
    registry.refresh_docs()
    hits = registry.search_docs(
        {"bool": {"filter": [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"kb_id": kb.kb_id}}]}},
        size=100,
        sort=[{"doc_id": "asc"}],
    )
    return [hit["_source"]["doc_id"] for hit in hits]


def test_the_last_sweep_ends_while_writers_keep_rewriting_records(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registry_module, "FENCED_SWEEP_S", 2.0)
    kb = new_kb(registry)
    ids = _records(registry, kb, 20)
    writers = [Rewriter(registry, kb, doc_id) for doc_id in ids[:WRITERS]]
    for writer in writers:
        writer.start()
    for writer in writers:
        assert writer.wrote.wait(30)

    deleted = registry.delete_kb_records(kb.tenant_id, kb.kb_id, FIELDS, final=True)

    assert sorted(doc.doc_id for doc in deleted) == ids  # each once, the rewritten ones too
    assert _left(registry, kb) == []
    for writer in writers:
        writer.join(30)
        assert not writer.is_alive()  # its next write found the record gone, and it stopped
    assert _left(registry, kb) == []  # and no write brought a record back


def test_a_first_sweep_deletes_what_it_can_and_returns_what_went(registry: Registry) -> None:
    kb = new_kb(registry)
    ids = _records(registry, kb, 3)
    latest = registry.require_doc(kb.tenant_id, kb.kb_id, ids[1])
    registry.replace_doc(latest, latest.doc.model_copy(update={"content_hash": "h2", "content_version": 2}))

    deleted = registry.delete_kb_records(kb.tenant_id, kb.kb_id, FIELDS, final=False)

    assert {doc.doc_id: (doc.content_hash, doc.content_version) for doc in deleted} == {
        ids[0]: ("h", 1),
        ids[1]: ("h2", 2),  # the version deleted, whose bytes and artifacts go with it
        ids[2]: ("h", 1),
    }
    assert _left(registry, kb) == []
    assert registry.delete_kb_records(kb.tenant_id, kb.kb_id, FIELDS, final=True) == []

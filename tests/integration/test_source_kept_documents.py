"""Documents kept when their source is forgotten (DELETE with keep_documents) are uploads: an
upload may replace them, and a source added again under that id does not own them (its removal
deleted them). Their release as uploads is one task of the cluster, which skips a record written
at that moment: those two rules hold for such a document all the same.

The source records live in indexes of the test's own, which the stack's runners never see."""

from __future__ import annotations

import time

import pytest

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.ingest import Ingestor
from shared.models import Outcome
from shared.registry import Registry
from shared.sources.models import FolderSpec
from shared.sources.service import Sources, folder_roots
from shared.sources.store import SourceStore
from shared.wiring import Services
from tests.integration.helpers import new_kb, share_source

pytestmark = pytest.mark.integration


def test_a_kept_document_its_release_skipped_is_an_upload_all_the_same(
    services: Services,
    registry: Registry,
    own_source_store: SourceStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kb = new_kb(registry, pii_policy="off")
    store = own_source_store
    sources = Sources(settings, store, registry, services.redis)
    ingestor = Ingestor(settings, registry, services.blobs, services.sender, services.redis, store.exists)
    source = store.create(share_source(kb))
    brought = ingestor.submit(
        kb.tenant_id, kb.kb_id, b"Puffins nest in burrows.", filename="a.txt", source_id=source.source_id
    )
    with pytest.raises(RaglineError) as owned:  # while its source stands, it is the source's
        ingestor.submit(kb.tenant_id, kb.kb_id, b"An upload.", filename="a.txt")
    assert owned.value.code == ErrorCode.CONFLICT

    with monkeypatch.context() as patch:  # the release skipped it (written at that moment)
        patch.setattr(registry, "detach_source", lambda *_: None)
        assert sources.remove(kb.tenant_id, kb.kb_id, source.source_id, keep_documents=True) is None
    assert registry.require_doc(kb.tenant_id, kb.kb_id, brought.doc_id).doc.source_id == source.source_id

    replaced = ingestor.submit(kb.tenant_id, kb.kb_id, b"An upload.", filename="a.txt")
    assert replaced.outcome == Outcome.UPDATED

    # Added again under that id while a kept document still carries it: refused, and released.
    ingestor.submit(kb.tenant_id, kb.kb_id, b"Terns.", filename="b.txt", source_id=source.source_id)
    root = folder_roots(settings, kb.tenant_id)[0]
    spec = FolderSpec.model_validate(
        {"type": "folder", "source_id": source.source_id, "settings": {"path": str(root / "share")}}
    )
    with pytest.raises(RaglineError) as refused:
        sources.add(kb.tenant_id, kb.kb_id, spec)
    assert refused.value.code == ErrorCode.CONFLICT
    # As a client would: again in a moment (each try asks for the release again, which skips a
    # document its pipeline is writing at that moment).
    deadline = time.monotonic() + 120
    while True:
        try:
            added = sources.add(kb.tenant_id, kb.kb_id, spec)
            break
        except RaglineError as again:
            if again.code != ErrorCode.CONFLICT or time.monotonic() > deadline:
                raise  # another refusal, or the kept documents were never released
            time.sleep(0.5)
    assert added.source_id == source.source_id
    assert registry.source_documents(kb.tenant_id, kb.kb_id, source.source_id) == {}

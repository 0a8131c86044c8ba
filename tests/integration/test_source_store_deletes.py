"""A knowledge base's sources go with it even while they are being written: a source changed (a
PATCH, a run recording its end) during the KB's deletion used to outlive the KB, go on running,
and fill a new KB of the same id. The records live in indexes of the test's own (another prefix)."""

from __future__ import annotations

import threading
import uuid

import pytest

from shared.sources.models import Source, SourceType
from shared.sources.store import SourceNotFound, SourceStore

pytestmark = pytest.mark.integration

SOURCES = 20


@pytest.fixture
def store(own_source_store: SourceStore) -> SourceStore:
    return own_source_store


def test_sources_changed_while_their_kb_is_deleted_are_deleted_too(store: SourceStore) -> None:
    ids = [f"s{n}" for n in range(SOURCES)]
    for source_id in ids:
        store.create(
            Source(tenant_id="t", kb_id="kb", source_id=source_id, type=SourceType.FOLDER, settings={})
        )
    stop = threading.Event()
    writes = [0]

    def keep_changing() -> None:
        while not stop.is_set():
            for source_id in ids:
                try:
                    store.update(
                        "t", "kb", source_id, lambda s: s.model_copy(update={"name": uuid.uuid4().hex})
                    )
                    writes[0] += 1
                except SourceNotFound:
                    pass  # deleted already: as a PATCH after the deletion finds it

    writer = threading.Thread(target=keep_changing)
    writer.start()
    try:
        while writes[0] < SOURCES:  # the writes are under way before the deletion starts
            stop.wait(0.05)
        store.drop_kb("t", "kb")
    finally:
        stop.set()
        writer.join()
    store.client.indices.refresh(index=store.sources)
    assert store.of_kb("t", "kb") == []
    for source_id in ids:
        with pytest.raises(SourceNotFound):
            store.get("t", "kb", source_id)

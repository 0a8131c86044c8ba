"""Which stored versions retire older generations of their document's chunks."""

from __future__ import annotations

from typing import cast

from shared.models import Document
from workers.context import WorkerContext
from workers.stages.store import _stored


def test_only_a_later_version_retires_older_generations() -> None:
    ctx = cast(WorkerContext, None)  # only decided here: the retiring itself would use it
    first = Document(tenant_id="t", kb_id="k", doc_id="d.txt", content_hash="0" * 64, file_size=1)
    assert first.content_version == 1
    stored = _stored(ctx, first, chunk_count=3, batch_documents=1)
    assert stored.after is None
    assert stored.updates["active_generation"] == 1
    assert _stored(ctx, first.model_copy(update={"content_version": 2}), 3, 1).after is not None

"""A source run's batch (`GET /v1/batches/{run_id}`, MCP `get_batch_status`) as the catalog reads
it: found before the run has submitted anything, and not done while the run goes on, even when
every document it has submitted so far is done. The run records live in indexes of the test's
own, which the stack's runners never see."""

from __future__ import annotations

import uuid

import pytest

from shared.catalog import Catalog
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.models import DocStatus
from shared.registry import Registry
from shared.sources.models import RunStatus, SyncRun
from shared.sources.store import SourceStore
from shared.wiring import Services
from tests.integration.helpers import new_kb, orphan

pytestmark = pytest.mark.integration


def test_a_run_s_batch_is_found_at_once_and_done_only_once_the_run_has_ended(
    services: Services, registry: Registry, own_source_store: SourceStore, settings: Settings
) -> None:
    kb = new_kb(registry)
    catalog = Catalog(settings, registry, services.ingestor)
    catalog.sources = own_source_store
    run = SyncRun(
        run_id=uuid.uuid4().hex,
        tenant_id=kb.tenant_id,
        kb_id=kb.kb_id,
        source_id="share",
        status=RunStatus.RUNNING,
    )
    own_source_store.create_run(run)

    # Nothing submitted yet: it was NOT_FOUND, though the run said to follow it there.
    empty = catalog.batch(kb.tenant_id, run.run_id)
    assert (empty.total, empty.done) == (0, False)

    orphan(registry, settings, kb, "a.txt", b"one", status=DocStatus.READY, batch_id=run.run_id)
    registry.client.indices.refresh(index=registry.docs)
    going = catalog.batch(kb.tenant_id, run.run_id)
    assert (going.total, going.done) == (1, False)  # the run may submit more

    own_source_store.update_run(run.run_id, lambda r: r.model_copy(update={"status": RunStatus.SUCCEEDED}))
    ended = catalog.batch(kb.tenant_id, run.run_id)
    assert (ended.total, ended.counts, ended.done) == (1, {"ready": 1}, True)
    orphan(registry, settings, kb, "b.txt", b"two", status=DocStatus.QUEUED, batch_id=run.run_id)
    late = catalog.batch(kb.tenant_id, run.run_id)  # sent as the run ended, not refreshed yet
    assert (late.total, late.done) == (2, False)

    other = new_kb(registry)
    with pytest.raises(RaglineError) as refused:
        catalog.batch(other.tenant_id, run.run_id)  # another tenant's run is no batch of its
    assert refused.value.code == ErrorCode.NOT_FOUND

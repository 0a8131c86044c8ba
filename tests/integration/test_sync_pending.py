"""The pending sync runs as the runners read them from OpenSearch: grouped by tenant, each tenant's
oldest first, so that a tenant that queued many runs cannot keep the others' from every runner.
The runs live in indexes of the test's own (another prefix): the stack's runners never see them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from shared.sources.models import RunStatus, SyncRun
from shared.sources.store import SourceStore
from workers.sources.runner import fair_order

pytestmark = pytest.mark.integration

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(own_source_store: SourceStore) -> SourceStore:
    return own_source_store


def _queue(store: SourceStore, tenant: str, count: int, minute: int, status: RunStatus) -> list[str]:
    ids = []
    for n in range(count):
        run = SyncRun(
            run_id=f"{tenant}-{minute + n}",
            tenant_id=tenant,
            kb_id="kb",
            source_id=f"s{n}",
            status=status,
            created_at=T0 + timedelta(minutes=minute + n),
        )
        store.create_run(run)
        ids.append(run.run_id)
    return ids


def test_a_tenant_that_queued_many_runs_first_does_not_hide_another_tenants_run(store: SourceStore) -> None:
    flood = _queue(store, "flood", 30, 0, RunStatus.QUEUED)
    _queue(store, "flood", 2, 100, RunStatus.SUCCEEDED)  # ended runs are not pending
    late = _queue(store, "late", 1, 500, RunStatus.QUEUED)
    running = _queue(store, "resumed", 1, 600, RunStatus.RUNNING)  # its worker died: claimable
    store.client.indices.refresh(index=store.runs)

    by_tenant = store.pending_runs(per_tenant=20)

    assert [runs[0].tenant_id for runs in by_tenant] == ["flood", "late", "resumed"]
    assert [r.run_id for r in by_tenant[0]] == flood[:20]  # the oldest, in order
    assert [r.run_id for r in by_tenant[1]] == late
    assert [r.run_id for r in by_tenant[2]] == running
    # One list of all runs, oldest first (what the runners read before), put the other tenants'
    # behind all 30: now each is first in a round of every three.
    firsts = {fair_order(by_tenant, turn)[0].run_id for turn in range(3)}
    assert firsts == {flood[0], late[0], running[0]}

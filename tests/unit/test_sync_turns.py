"""Which pending sync run a runner tries first: every tenant in turn, not the oldest run's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from shared.sources.models import SyncRun
from workers.sources.runner import fair_order

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _runs(tenant: str, count: int, first_minute: int = 0) -> list[SyncRun]:
    return [
        SyncRun(
            run_id=f"{tenant}-{n}",
            tenant_id=tenant,
            kb_id="kb",
            source_id=f"s{n}",
            created_at=T0 + timedelta(minutes=first_minute + n),
        )
        for n in range(count)
    ]


def test_each_tenant_goes_first_in_turn_however_many_runs_another_queued_before() -> None:
    by_tenant = [_runs("flood", 500), _runs("late", 1, first_minute=600), _runs("other", 2, 700)]
    firsts = [fair_order(by_tenant, turn)[0].tenant_id for turn in range(6)]
    assert firsts == ["flood", "late", "other", "flood", "late", "other"]


def test_the_runs_interleave_by_tenant_each_tenant_oldest_first() -> None:
    order = fair_order([_runs("a", 3), _runs("b", 1, 10), _runs("c", 2, 20)], turn=1)
    assert [r.run_id for r in order] == ["b-0", "c-0", "a-0", "c-1", "a-1", "a-2"]


def test_no_run_is_left_out_and_tenants_without_runs_take_no_turn() -> None:
    by_tenant = [_runs("a", 4), [], _runs("b", 2, 10)]
    for turn in range(5):
        order = fair_order(by_tenant, turn)
        assert sorted(r.run_id for r in order) == ["a-0", "a-1", "a-2", "a-3", "b-0", "b-1"]
        assert order[0].tenant_id == ("a", "b")[turn % 2]
    assert fair_order([], 3) == []

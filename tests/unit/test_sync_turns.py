"""Which pending sync run a runner tries first: every tenant in turn, not the oldest run's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import cast

import redis

from shared.sources.models import SyncRun
from shared.wiring import Services
from workers.sources.runner import POLL_S, SyncRunner, fair_order

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


def test_a_waiting_tenant_is_first_within_as_many_rounds_as_there_are_tenants() -> None:
    """Each round one runner takes the first run offered, and every busy tenant queues another run
    as one of its own is taken: their oldest runs, and the order by oldest run, keep changing."""
    busy = {f"t{n:02d}": _runs(f"t{n:02d}", 20, first_minute=n) for n in range(10)}
    waiting = _runs("v", 1, first_minute=5)
    clock = 1000
    for turn in range(1, 11):
        by_tenant = sorted([*busy.values(), waiting], key=lambda runs: runs[0].created_at)
        taken = fair_order(by_tenant, turn)[0]
        if taken.tenant_id == "v":
            return
        runs = busy[taken.tenant_id]
        runs.remove(taken)
        runs.extend(_runs(taken.tenant_id, 1, first_minute=clock))
        clock += 1
    raise AssertionError("the waiting tenant was passed over for more rounds than there are tenants")


def test_the_runs_interleave_by_tenant_each_tenant_oldest_first() -> None:
    order = fair_order([_runs("c", 2, 20), _runs("a", 3), _runs("b", 1, 10)], turn=1)
    assert [r.run_id for r in order] == ["b-0", "c-0", "a-0", "c-1", "a-1", "a-2"]


def test_no_run_is_left_out_and_tenants_without_runs_take_no_turn() -> None:
    by_tenant = [_runs("a", 4), [], _runs("b", 2, 10)]
    for turn in range(5):
        order = fair_order(by_tenant, turn)
        assert sorted(r.run_id for r in order) == ["a-0", "a-1", "a-2", "a-3", "b-0", "b-1"]
        assert order[0].tenant_id == ("a", "b")[turn % 2]


def test_a_runner_waits_its_poll_while_redis_is_away() -> None:
    """The wake-up list paced the rounds: with Redis refusing, the loop ran flat out."""
    rounds: list[int] = []

    class Away:
        def incr(self, _key: str) -> int:
            raise redis.ConnectionError("refused")

        def blpop(self, _keys: list[str], timeout: float = 0) -> None:
            raise redis.ConnectionError("refused")

    class Store:
        def due(self, _now: object) -> list[object]:
            rounds.append(1)
            return []

    services = cast(Services, SimpleNamespace(source_store=Store()))
    sync_runner = SyncRunner(cast(redis.Redis, Away()), "me", lambda: services, 30)
    sync_runner.start()
    time.sleep(1.0)
    sync_runner.stop(timeout_s=POLL_S + 5)
    assert len(rounds) <= 2
    assert fair_order([], 3) == []

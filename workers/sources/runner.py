"""Every worker's sync runner: a thread of the main process that claims queued runs (and runs whose
worker died) and carries them out, one at a time.

A run holds its source under a Redis lease (`workers/leader.hold`), renewed while it goes on: one
run per source at a time across every worker, and a crashed worker's run is resumed by whichever
runner takes the lease once it lapses (at once on the same host, whose dead holder is seen). Runs
go in the main process, beside the reconciler, and not in the pool: a long listing would hold a
pool process the pipeline needs, and what a run submits is processed there meanwhile.

The runner also queues scheduled runs that are due: their run id names the source and the due
time, so two runners that both see a source due create one run.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

import redis
from opensearchpy.exceptions import ConflictError

from shared.errors import ErrorCode, RaglineError
from shared.models import utcnow
from shared.sources.models import Source, SyncRun
from shared.sources.service import WAKE_KEY
from shared.sources.store import SourceNotFound, SourceStore, source_key
from shared.wiring import Services
from workers import leader
from workers.failures import is_outage
from workers.sources.sync import MAKE_WAY_AFTER_S, MadeWay, Stopped, SyncEngine, faulted
from workers.sources.types import connector_for

log = logging.getLogger(__name__)

POLL_S = 5.0  # pending runs are looked for this often even when nobody wakes the runner
RUN_ATTEMPTS = 5  # a run whose engine keeps failing on a retryable error ends failed after these


TURN_KEY = "ragline:sources:turn"  # counts the runners' rounds: which tenant is offered first


def fair_order(by_tenant: list[list[SyncRun]], turn: int) -> list[SyncRun]:
    """The runs to try in turn: each tenant's oldest, then each one's second, and so on, the tenant
    that goes first moving on by one with each `turn`, so every tenant with runs waiting gets a
    runner in as many rounds as there are such tenants, however many runs another one queued.

    The tenants take their places by name, not by their oldest run: that order changed as runs
    ended, and a tenant could be passed over round after round (five times the tenants' number).
    """
    tenants = sorted((runs for runs in by_tenant if runs), key=lambda runs: runs[0].tenant_id)
    if not tenants:
        return []
    start = turn % len(tenants)
    rotated = tenants[start:] + tenants[:start]
    depth = max(len(runs) for runs in rotated)
    return [runs[i] for i in range(depth) for runs in rotated if i < len(runs)]


def lease_key(run: SyncRun) -> str:
    return f"ragline:sources:run:{source_key(run.tenant_id, run.kb_id, run.source_id)}"


def scheduled_run_id(tenant_id: str, kb_id: str, source_id: str, due: str) -> str:
    return "s" + hashlib.sha256(f"{source_key(tenant_id, kb_id, source_id)}@{due}".encode()).hexdigest()[:31]


class Keeper:
    """Renews a run's lease while the run goes on; `alive` turns false once it could not."""

    def __init__(self, client: redis.Redis, key: str, me: str, ttl_s: int) -> None:
        self.client, self.key, self.me, self.ttl_s = client, key, me, ttl_s
        self.alive = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="ragline-sync-lease", daemon=True)

    def __enter__(self) -> Keeper:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(self.ttl_s)
        with contextlib.suppress(redis.RedisError):
            self.client.eval(leader._RELEASE, 1, self.key, self.me)

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.alive = leader.hold(self.client, self.key, self.me, self.ttl_s)
            except redis.RedisError:
                self.alive = False
            if not self.alive:
                return


def engine_of(services: Services) -> SyncEngine:
    settings = services.settings
    return SyncEngine(
        services.source_store,
        services.registry,
        services.ingestor,
        lambda source: connector_for(source, settings),
        settings.api.retry_after_s,
        settings.sources.max_items,
    )


class SyncRunner:
    """`context` gives the process's services, built on first use (OpenSearch may be down at start)."""

    def __init__(self, client: redis.Redis, me: str, context: Callable[[], Services], lease_s: int) -> None:
        self.client, self.me, self.context, self.lease_s = client, me, context, lease_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ragline-sync-runner", daemon=True)
        self._made_way: dict[str, float] = {}  # run id -> when it made way (monotonic)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self.queue_due()
                ran = self.run_pending()
                failures = 0
            except Exception:
                failures += 1
                log.warning("sync runner round failed (%d in a row)", failures, exc_info=failures == 1)
                ran = False
            if not ran:
                try:
                    self.client.blpop([WAKE_KEY], timeout=POLL_S)
                except redis.RedisError:
                    # The wake-up list paces the rounds; with Redis away, the loop ran flat out,
                    # a failing round (and an OpenSearch search) at a time.
                    self._stop.wait(POLL_S)

    def queue_due(self) -> None:
        """Queue a run of every scheduled source that is due."""
        services = self.context()
        store = services.source_store
        for source in store.due(utcnow()):
            due = source.next_run_at
            assert due is not None
            run_id = scheduled_run_id(source.tenant_id, source.kb_id, source.source_id, due.isoformat())
            try:
                services.sources.start(source, "schedule", run_id=run_id)
            except ConflictError:
                pass  # the run's id is taken: another runner queued this very run first
            except RaglineError as error:
                if error.code != ErrorCode.CONFLICT:  # CONFLICT: another runner queued it first
                    # One source's refusal must not keep the others' runs from being queued or
                    # run: it is tried again next round.
                    log.warning(
                        "scheduled sync of %s/%s not queued: %s", source.kb_id, source.source_id, error
                    )
                    continue

            def taken(current: Source, due: datetime = due) -> Source:
                """The next time is set when the run ends (workers/sources/sync.py)."""
                return (
                    current.model_copy(update={"next_run_at": None})
                    if current.next_run_at == due
                    else current
                )

            store.update(source.tenant_id, source.kb_id, source.source_id, taken)

    def _fail(self, engine: SyncEngine, run: SyncRun, error: Exception) -> None:
        """End `run` failed; if even that fails (its records are what broke), mark it failed
        plainly, so that it is not claimed first again in every round."""
        try:
            engine.fail(run, error)
        except Exception:
            log.exception("sync %s could not be ended; marked failed", run.run_id)
            engine.store.update_run(run.run_id, faulted)

    def _after_those_that_made_way(self, runs: list[SyncRun]) -> list[SyncRun]:
        """`runs`, those that just made way for others last: taken first again (the fair order's
        turn comes round to their tenant every other round of two), they made the others wait
        another MAKE_WAY_AFTER_S."""
        now = time.monotonic()
        self._made_way = {run_id: at for run_id, at in self._made_way.items() if now - at < MAKE_WAY_AFTER_S}
        return sorted(runs, key=lambda run: run.run_id in self._made_way)

    def _others_wait(self, store: SourceStore, run: SyncRun) -> bool:
        """Whether a run of another tenant waits for a runner: queued, or its runner gone. Not one
        that just made way itself: two tenants that both keep their queues full would hand the
        runner back and forth, each listing its source again each time."""
        return any(
            other.tenant_id != run.tenant_id
            and other.run_id not in self._made_way
            and not leader.held(self.client, lease_key(other))
            for runs in store.pending_runs()
            for other in runs
        )

    def run_pending(self) -> bool:
        """Claim one pending run and carry it out; False when there was none to claim."""
        services = self.context()
        store = services.source_store
        turn = int(self.client.incr(TURN_KEY))
        for run in self._after_those_that_made_way(fair_order(store.pending_runs(), turn)):
            key = lease_key(run)
            if not leader.hold(self.client, key, self.me, self.lease_s):
                continue
            with Keeper(self.client, key, self.me, self.lease_s) as keeper:
                try:
                    current = store.get_run(run.tenant_id, run.kb_id, run.source_id, run.run_id)
                    if not current.status.active:
                        continue  # ended or cancelled since it was listed
                    store.update_run(run.run_id, lambda r: r.model_copy(update={"claimed_by": self.me}))
                except SourceNotFound:
                    continue  # deleted since it was listed, with its source or its KB

                engine = engine_of(services)
                try:
                    engine.run(
                        current,
                        lambda: keeper.alive and not self._stop.is_set(),
                        functools.partial(self._others_wait, store, current),
                    )
                except MadeWay:
                    self._made_way[run.run_id] = time.monotonic()
                    log.info("sync %s made way for another tenant's run; it goes on later", run.run_id)
                except Stopped:
                    log.info("sync %s stopped (cancelled, lease lost or worker stopping)", run.run_id)
                except Exception as error:
                    if is_outage(error):
                        raise  # resumed once OpenSearch or Redis answers again
                    retryable = isinstance(error, RaglineError) and error.retryable
                    if retryable and current.attempts + 1 < RUN_ATTEMPTS:
                        raise  # the round fails; the run is tried again after the runner's pause
                    log.exception("sync %s failed unexpectedly; it ends failed", run.run_id)
                    self._fail(engine, current, error)
            return True
        return False

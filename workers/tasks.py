"""Celery tasks of the Ragline workers: a health ping and the pipeline stage hop."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Any

import redis
from celery import Task, shared_task
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown

from shared import fairqueue, logs, tracing
from shared.catalog import REEMBED_TASK
from shared.config import get_settings
from shared.ingest import STAGE_TASK, StageRef
from shared.models import Stage
from shared.queue import enqueue, redis_client
from shared.registry import Registry
from shared.wiring import blob_store
from workers import confinement, leader, liveness, metrics
from workers.context import worker_context
from workers.cpu_affinity import pin_pool_process
from workers.failures import is_outage, outage_countdown
from workers.handover import resend
from workers.pipeline import STAGES
from workers.reconciler import reconcile_once
from workers.reembed import reembed
from workers.runner import Done, Retry, run_stage
from workers.sources.runner import SyncRunner
from workers.warmup import warm_up

log = logging.getLogger(__name__)

RECONCILER_LEASE, FEEDER_LEASE = "ragline:reconciler:leader", "ragline:fair:leader"
# The main process's periodic jobs and heartbeat, once the worker is ready; stopped on shutdown.
_JOBS: list[leader.PeriodicJob] = []
_HEART: list[liveness.Heartbeat] = []
_RUNNERS: list[SyncRunner] = []


@worker_ready.connect
def _start_periodic_jobs(sender: Any = None, **_: Any) -> None:
    """Every worker runs the reconciler and the fair-queue feeder, a Redis lease picking one to act,
    and a sync runner (workers/sources/runner.py).

    The jobs build their context on first use, so a worker that starts before OpenSearch still
    gets them (a round only fails and retries).
    """
    settings = get_settings()
    broker = redis_client(settings)
    me = f"{socket.gethostname()}:{os.getpid()}"
    celery = settings.celery
    # First: without its heartbeat a live worker reads as dead, and its documents are sent again.
    blobs = blob_store(settings, broker)
    _HEART.append(liveness.Heartbeat(broker, me, celery.reconcile_interval_s, store_id=blobs.identity))
    _HEART[0].start()

    def reconcile() -> object:
        return reconcile_once(worker_context())

    def feed() -> object:
        ctx = worker_context()
        return fairqueue.feed(ctx.redis, ctx.sender, ctx.settings, celery.bulk_queue_depth)

    _JOBS.append(
        leader.start(
            "ragline-reconciler", broker, RECONCILER_LEASE, me, celery.reconcile_interval_s, reconcile
        )
    )
    _JOBS.append(leader.start("ragline-feeder", broker, FEEDER_LEASE, me, 0.2, feed))
    _RUNNERS.append(SyncRunner(broker, me, worker_context, settings.sources.run_lease_s))
    _RUNNERS[0].start()


@worker_shutdown.connect
def _leave(sender: Any = None, **_: Any) -> None:
    for heart in _HEART:
        with contextlib.suppress(redis.RedisError):
            heart.leave()
    for runner in _RUNNERS:
        runner.stop(timeout_s=10)  # a run under way stops at its next check, to be resumed
    for job in _JOBS:
        with contextlib.suppress(redis.RedisError):
            job.stop(timeout_s=10)


@worker_init.connect
def _shield(**_: Any) -> None:
    """Before the pool forks: parse processes of the same user must not open the main process's
    or a pool process's descriptors through /proc, even where they cannot be isolated."""
    confinement.shield_from_children()


@worker_ready.connect
def _serve_metrics(sender: Any = None, **_: Any) -> None:
    metrics.serve(get_settings())


@worker_process_init.connect
def _trace(**_: Any) -> None:
    """Each pool process gets its own span exporter: an exporter's thread does not survive fork."""
    tracing.setup(get_settings(), "worker")


@worker_process_init.connect
def _warm_up(**_: Any) -> None:
    """Load parsers and models in each pool process before its first task, not during it; then
    keep it on a core of its own (workers/cpu_affinity.py), once its parse servers are forked."""
    warm_up()
    if get_settings().celery.pin_pool_processes:
        core = pin_pool_process()
        log.info("pool process %d on core %s", os.getpid(), core)


@shared_task(name="ragline.ping", acks_late=False)
def ping(payload: str = "") -> dict[str, Any]:
    """Answer from inside a worker process: proves broker, worker and result backend work."""
    return {"payload": payload, "hostname": socket.gethostname(), "pid": os.getpid()}


@shared_task(name=STAGE_TASK, bind=True, max_retries=None, ignore_result=True)
def stage(
    self: Task[Any, Any], *, tenant_id: str, kb_id: str, doc_id: str, content_version: int, stage: str
) -> None:
    """Run one stage for one document (and the stages chained after it), then enqueue the next
    (see workers/runner.py)."""
    ref = StageRef(tenant_id, kb_id, doc_id, content_version, Stage(stage))
    parent = {name: self.request.get(name) for name in tracing.HEADERS}
    with (
        logs.bound(tenant=tenant_id, kb=kb_id, doc_id=doc_id, stage=stage),
        tracing.span(f"stage {stage}", parent, tenant=tenant_id, kb=kb_id, doc_id=doc_id, stage=stage),
    ):
        try:
            run_stage(worker_context(), ref, STAGES, retries_done=self.request.retries)
        except Done:
            return
        except Retry as retry:
            countdown, counted = retry.countdown, retry.counted
            if counted:
                resend(ref, lambda: self.retry(countdown=countdown), _registry)
            else:
                resend(ref, lambda: _send_later(self, ref, countdown), _registry)
        except Exception as error:
            if not is_outage(error):
                raise
            # The registry or broker itself is unreachable, before or after the stage's own work:
            # nothing could be recorded, so the same delivery simply comes back later.
            resend(ref, lambda: _send_later(self, ref, outage_countdown()), _registry)


def _registry() -> Registry:
    return worker_context().registry


def _send_later(task: Task[Any, Any], ref: StageRef, countdown: float) -> None:
    """A fresh send rather than a Celery retry: waiting out an outage uses up no retries."""
    queue = (task.request.delivery_info or {}).get("routing_key") or fairqueue.BULK_QUEUE
    enqueue(task.app, get_settings(), STAGE_TASK, kwargs=ref.as_kwargs(), queue=queue, countdown=countdown)


@shared_task(name=REEMBED_TASK, ignore_result=True, soft_time_limit=6 * 3600, time_limit=6 * 3600 + 60)
def reembed_kb(*, tenant_id: str, kb_id: str, model: str) -> None:
    """Move a knowledge base to another embedding model (see workers/reembed.py)."""
    with logs.bound(tenant=tenant_id, kb=kb_id):
        reembed(worker_context(), tenant_id, kb_id, model)

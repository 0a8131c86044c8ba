"""Sending work to the workers by task name, so that services never import worker code."""

from __future__ import annotations

from typing import Any

import redis
from celery import Celery
from celery.result import AsyncResult

from shared import tracing
from shared.config import Settings
from shared.models import PIPELINE, Stage

# How long a send waits for a pooled broker connection: past it the send fails (OperationalError,
# which the ingest path hands to the reconciler) instead of holding its caller's thread forever.
BROKER_POOL_WAIT_S = 10.0


def redis_client(settings: Settings) -> redis.Redis:
    """The Redis client of a process (fair lanes, caches, leases): every connect and answer bounded.

    Without socket timeouts a stalled Redis holds the calling thread for good, and with it one of
    the API's request threads.
    """
    bound = settings.redis.timeout_s
    return redis.Redis.from_url(settings.redis.url, socket_timeout=bound, socket_connect_timeout=bound)


def broker_client(settings: Settings) -> Celery:
    """A Celery app used only to send tasks by name to the configured broker."""
    app = Celery("ragline-sender", broker=settings.redis.url, backend=settings.redis.url)
    app.conf.broker_transport_options = {"visibility_timeout": settings.celery.visibility_timeout_s}
    app.conf.broker_connection_retry_on_startup = True
    app.conf.broker_pool_acquire_timeout = BROKER_POOL_WAIT_S
    # Remote control (the readiness ping) publishes on the connection it is given, never through
    # the shared producer pool, whose producers each take a second connection from the pool
    # (celery-types does not declare the mailbox).
    app.control.mailbox.producer_pool = None  # type: ignore[attr-defined]
    return app


def stage_queue(settings: Settings, queue: str, stage: str) -> str:
    """Where a stage of a document in `queue` is sent: the document's queue unless the stage has its own.

    The one place that routes stages, so that workers can specialise (parse-heavy, embed-heavy).
    """
    template = settings.celery.stage_queues.get(Stage(stage))
    return template.replace("{queue}", queue) if template else queue


def lane_queues(settings: Settings, queue: str) -> list[str]:
    """A document queue and the stage queues its documents pass through, in pipeline order."""
    names = [queue]
    for stage in PIPELINE:
        name = stage_queue(settings, queue, stage)
        if name not in names:
            names.append(name)
    return names


def all_queues(settings: Settings) -> list[str]:
    """Every queue a worker may serve, highest priority first (each document queue, then its stages)."""
    names: list[str] = []
    for queue in settings.celery.queues:
        names += [name for name in lane_queues(settings, queue) if name not in names]
    return names


def enqueue(
    app: Celery,
    settings: Settings,
    task_name: str,
    *,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    queue: str,
    countdown: float | None = None,
    headers: dict[str, str] | None = None,
    retries: int = 0,
) -> AsyncResult[Any]:
    """Send one task by name; every send carries an expiry so a stale backlog never runs.

    The message carries the current trace context, or `headers` saved when the work was accepted;
    `retries` is what the task sees as `request.retries` (a retry sent by hand, not by Celery).
    """
    return app.send_task(
        task_name,
        args=args,
        kwargs=kwargs or {},
        queue=queue,
        countdown=countdown,
        expires=settings.celery.task_expires_s,
        headers=tracing.carrier() if headers is None else headers,
        retries=retries,
    )


def ping_workers(app: Celery, timeout_s: float) -> list[dict[str, Any]]:
    """The workers that answer a control ping within `timeout_s`.

    The ping has a connection of its own, with socket timeouts of `timeout_s`, never a pooled
    one: a broadcast over the pool held one pooled connection while its producer waited for a
    second, and as many concurrent pings as the pool has connections waited for each other
    forever. A fresh connection also never carries a socket that died in a broker restart.
    """
    options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    with app.connection_for_write(connect_timeout=timeout_s, transport_options=options) as connection:
        return list(app.control.ping(timeout=timeout_s, connection=connection) or [])

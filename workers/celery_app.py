"""The workers' Celery application and its reliability settings (docs/architecture.md#pipeline-stages)."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import setup_logging
from kombu import Queue

from shared import logs
from shared.config import Settings, get_settings
from shared.queue import all_queues

POOL_PROCESS_START_S = 300.0


def celery_config(settings: Settings) -> dict[str, Any]:
    """Celery settings derived from Ragline's settings."""
    celery = settings.celery
    return {
        "broker_url": settings.redis.url,
        # Results only serve health checks and tests: the document registry is the status store.
        "result_backend": settings.redis.url,
        "result_expires": 3600,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        # A task is acknowledged after it ran, and a worker that dies mid-task (SIGKILL, OOM)
        # puts it back: with the Redis broker acks_late alone does not do that.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Long tasks: never hold a second message that another worker could be running.
        "worker_prefetch_multiplier": 1,
        # Redis redelivers an unacknowledged task after the visibility timeout; it must outlast
        # the slowest task or that task runs twice.
        "broker_transport_options": {
            "visibility_timeout": celery.visibility_timeout_s,
            # Interactive before bulk, with a share for bulk (workers/queue_cycle.py).
            "queue_order_strategy": "workers.queue_cycle:InteractiveFirst",
        },
        "result_backend_transport_options": {"visibility_timeout": celery.visibility_timeout_s},
        # A task running when the broker connection drops finishes its stage: stages are fenced and
        # recovered through the registry, not through the message. Celery's cancelling killed the
        # pool process mid-stage (and one between releasing its document for a retry and sending
        # that retry left the document for its lease); its message is left to Redis instead.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # Recovers the tasks a lost broker connection takes with it (see workers/consumer.py).
        "worker_consumer": "workers.consumer:RecoveringConsumer",
        # A pool process loads its models before it reports up (workers/tasks.py _warm_up); on a
        # busy host that outlasts Celery's 4 s default, and a pool process replaced after a broker
        # outage was then killed and respawned forever.
        "worker_proc_alive_timeout": POOL_PROCESS_START_S,
        "broker_connection_retry_on_startup": True,
        "task_soft_time_limit": celery.soft_time_limit_s,
        "task_time_limit": celery.time_limit_s,
        "task_queues": [Queue(name) for name in all_queues(settings)],
        "task_default_queue": celery.queues[-1],
        "worker_concurrency": celery.worker_concurrency,
        "worker_hijack_root_logger": False,
        "worker_send_task_events": False,
        "task_send_sent_event": False,
    }


@setup_logging.connect
def _configure_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Celery, the pool processes and Ragline all log through Ragline's formatter."""
    settings = get_settings()
    logs.configure(
        "worker", loglevel or settings.log_level, settings.log_format, logs.secret_values(settings)
    )


def create_app(settings: Settings | None = None) -> Celery:
    """Build the worker's Celery app and register its tasks."""
    app = Celery("ragline")
    app.conf.update(celery_config(settings or get_settings()))
    app.autodiscover_tasks(["workers"], related_name="tasks", force=True)
    return app


app = create_app()

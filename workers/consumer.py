"""The worker's broker consumer: what a lost broker connection needs beyond Celery's own handling.

When the connection breaks, Celery drops the tasks the worker had reserved but not started, and
those it held for a countdown (an outage retry), and leaves them to the broker. Redis gives an
unacknowledged task back only after the visibility timeout (an hour), while its document waits
unclaimed under the 30-minute queue lease: a Redis restart mid-load left one so in the fault
tests. So each such document is handed to the reconciler, which sends its stage again as soon as
the broker is back; the copy Redis gives back later finds the document moved on and does nothing.

Celery 5.7 also closes the broken connection a second time after kombu has dropped the
transport's settings. Putting the unacknowledged messages back then raised an AttributeError
that killed the worker whenever it was waiting on the broker while holding such messages. With
the broker unreachable that put-back cannot succeed anyway, so the channels are told not to try.
Likewise a task that was running at the loss (it finishes its stage: see workers/celery_app.py)
is acknowledged on the closed channel, which kombu has detached from its connection: that too
raised an AttributeError that killed the worker. Such a message is left unsettled instead: Redis
gives it back after the visibility timeout, and its stage finds the document moved on.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

from celery.exceptions import CPendingDeprecationWarning
from celery.worker import state
from celery.worker.consumer import Consumer
from celery.worker.request import Request

from shared.ingest import STAGE_TASK, StageRef, hand_to_reconciler
from shared.models import Stage
from workers.context import worker_context

log = logging.getLogger(__name__)


class RecoveringConsumer(Consumer):
    def on_connection_error_after_connected(self, exc: Exception) -> None:
        scheduled = state.scheduled_requests  # type: ignore[attr-defined]  # not in the stubs
        held = [r for r in {*state.reserved_requests, *scheduled} if r not in state.active_requests]
        _skip_restore(self.connection)
        # Celery warns at every loss that cancelling running tasks becomes its default in 6.0;
        # Ragline turns it off on purpose (see workers/celery_app.py). Put in front each time:
        # Celery's logging setup puts an "always" filter for these warnings before older ones.
        warnings.filterwarnings("ignore", r"\s*In Celery 5.1 we introduced", CPendingDeprecationWarning)
        super().on_connection_error_after_connected(exc)
        refs = [ref for request in held if (ref := stage_ref(request)) is not None]
        if refs:
            # OpenSearch calls: kept off the thread that reconnects to the broker.
            threading.Thread(target=_hand_over, args=(refs,), name="ragline-held-tasks", daemon=True).start()

    def call_soon_ack(self, p: Any, *args: Any, **kwargs: Any) -> Any:
        return super().call_soon_ack(_unless_channel_closed(p), *args, **kwargs)  # type: ignore[misc]


def _unless_channel_closed(settle: Callable[..., Any]) -> Callable[..., Any]:
    """`settle` (a message's ack or reject), skipped once the message's channel has closed."""
    message = getattr(settle, "__self__", None)

    def run(*args: Any, **kwargs: Any) -> Any:
        channel = getattr(message, "channel", None)
        if channel is not None and getattr(channel, "connection", None) is None:
            log.info(
                "a task finished after the broker connection was lost; its message is left to the broker"
            )
            return None
        return settle(*args, **kwargs)

    return run


def _skip_restore(connection: Any) -> None:
    transport = getattr(connection, "_transport", None)  # not .transport: that builds a new one
    for channel in getattr(transport, "channels", ()):
        channel.do_restore = False


def stage_ref(request: Request) -> StageRef | None:
    """The document and stage a held task was for; None for other tasks."""
    if request.name != STAGE_TASK:
        return None
    kwargs = request.kwargs
    try:
        version, stage = int(kwargs["content_version"]), Stage(kwargs["stage"])
        return StageRef(kwargs["tenant_id"], kwargs["kb_id"], kwargs["doc_id"], version, stage)
    except (KeyError, TypeError, ValueError):
        return None


def _hand_over(refs: list[StageRef]) -> None:
    log.warning("broker connection lost holding %d stage task(s); handing them to the reconciler", len(refs))
    try:
        registry = worker_context().registry
    except Exception:  # OpenSearch down too: the documents' leases still run out
        log.warning("could not hand %d held stage task(s) to the reconciler", len(refs), exc_info=True)
        return
    for ref in refs:
        hand_to_reconciler(registry, ref)

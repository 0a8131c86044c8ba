"""The heartbeat of a running stage: keeps its documents' leases alive while the work runs.

A claim carries a short lease (`celery.stage_lease_s`), renewed here every quarter lease. A
worker that dies stops renewing, its documents' leases run out within one lease period, and the
reconciler sends their stage again. So a stuck document (claimed, its worker silent) is told from
a queued one (unclaimed, with a long lease) without waiting for the slowest stage there could be.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import timedelta
from types import TracebackType

from shared.config import Settings
from shared.ingest import QUEUE_LEASE
from shared.models import utcnow
from shared.registry import Conflict, Registry, Versioned
from workers.lifecycle import Policy

log = logging.getLogger(__name__)

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"  # who holds a claim this process made


def stage_lease(settings: Settings) -> timedelta:
    return timedelta(seconds=settings.celery.stage_lease_s)


def lifecycle_policy(settings: Settings) -> Policy:
    """The limits of this process's lifecycle decisions (workers/lifecycle.py)."""
    return Policy(
        worker=WORKER_ID,
        stage_lease=stage_lease(settings),
        queue_lease=QUEUE_LEASE,
        max_retries=settings.celery.max_retries,
    )


class LeaseKeeper:
    """Renews the leases of `claims` in a thread for the life of a `with` block.

    `claims()` afterwards gives the latest registry versions, which the stage's final write must
    use. A claim superseded meanwhile (a new version, a delete) is left as it was: the final write
    then meets the conflict and drops the stage's result, as it would without a heartbeat.
    """

    def __init__(self, registry: Registry, claims: list[Versioned], lease: timedelta) -> None:
        self._registry = registry
        self._claims = list(claims)
        self._lease = lease
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="ragline-lease", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()

    def claims(self) -> list[Versioned]:
        with self._lock:
            return list(self._claims)

    def renew(self) -> None:
        with self._lock:
            for position, claimed in enumerate(self._claims):
                doc = claimed.doc.model_copy(update={"lease_until": utcnow() + self._lease})
                try:
                    self._claims[position] = self._registry.replace_doc(claimed, doc)
                except Conflict:
                    continue
                except Exception:  # an outage: the next beat tries again
                    log.warning("lease renewal of %s failed", claimed.doc.doc_id, exc_info=True)

    def _beat(self) -> None:
        while not self._stop.wait(self._lease.total_seconds() / 4):
            self.renew()

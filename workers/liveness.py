"""Which workers are alive: each beats into a Redis hash; the reconciler notices the ones that stopped.

A worker that dies also takes the tasks it had reserved but not started: Redis keeps them
unacknowledged until the visibility timeout (an hour), and their documents still look `queued`
with a long lease. So when a worker stops beating, the reconciler sends every unfinished
document again at once (fenced duplicates cost a registry read each) instead of waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from shared import blob_sharing

log = logging.getLogger(__name__)

WORKERS_KEY = "ragline:workers"


def forget_dead(client: redis.Redis, silent_s: float) -> list[str]:
    """Workers silent for `silent_s` seconds, removed from the hash (each is reported once)."""
    now = time.time()
    raw = client.hgetall(WORKERS_KEY)
    seen = raw if isinstance(raw, dict) else {}
    dead = [_text(name) for name, at in seen.items() if now - float(at) > silent_s]
    if dead:
        client.hdel(WORKERS_KEY, *dead)
        blob_sharing.forget(client, *dead)
    return dead


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Heartbeat:
    """One worker's beat. A beat that landed after `leave` would register the stopped worker again,
    and its silence would then read as a death: beat and leave share a lock, and none follows a leave.

    The worker also announces the id of the blob store it reads (`store_id`, when given), against
    which the fronts check theirs (shared/blob_sharing.py), from a thread of its own: a store slow
    to answer (S3 retries a read for a minute and more) must not hold the beat, or the worker would
    look dead and its documents be sent again.
    """

    def __init__(
        self,
        client: redis.Redis,
        me: str,
        interval_s: float,
        store_id: Callable[[], str] | None = None,
    ) -> None:
        self.client = client
        self.me = me
        self.interval_s = interval_s
        self.store_id = store_id
        self._lock = threading.Lock()
        self._left = threading.Event()

    def beat(self) -> None:
        with self._lock:
            if not self._left.is_set():
                self.client.hset(WORKERS_KEY, self.me, str(time.time()))

    def announce(self) -> None:
        """The store's id, read again each time (a store emptied and begun again has a new one)."""
        if self.store_id is None:
            return
        store = self.store_id()
        with self._lock:
            if not self._left.is_set():
                blob_sharing.announce(self.client, self.me, store)

    def leave(self) -> None:
        """A clean shutdown: the worker's reserved tasks went back to the queue, nothing to recover."""
        with self._lock:
            self._left.set()
            self.client.hdel(WORKERS_KEY, self.me)
            blob_sharing.forget(self.client, self.me)

    def start(self) -> None:
        threading.Thread(target=self._every, args=(self.beat,), name="ragline-liveness", daemon=True).start()
        if self.store_id is not None:
            threading.Thread(
                target=self._every, args=(self.announce,), name="ragline-blob-store", daemon=True
            ).start()

    def _every(self, act: Callable[[], None]) -> None:
        """`act` each interval until the worker leaves; a failure is logged and tried again, never
        the end of the thread (a worker whose beat stopped would read as dead)."""
        while not self._left.is_set():
            try:
                act()
            except Exception:  # Redis or the store away, or anything else: retried
                log.warning("worker %s failed; retrying", act.__name__, exc_info=True)
            self._left.wait(self.interval_s)

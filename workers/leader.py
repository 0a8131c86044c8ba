"""Periodic jobs that one worker process at a time should run, elected by a Redis lease."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)


def hold(client: redis.Redis, key: str, me: str, ttl_s: int) -> bool:
    """Take or keep the lease `key`; True while this process holds it."""
    if client.set(key, me, nx=True, ex=ttl_s):
        return True
    if client.get(key) == me.encode():
        client.expire(key, ttl_s)
        return True
    return False


def run_as_leader(
    client: redis.Redis,
    key: str,
    me: str,
    interval_s: float,
    job: Callable[[], object],
    stop: threading.Event,
) -> None:
    """Run `job` every `interval_s` while holding the lease; an outage only skips a round."""
    ttl = max(2, int(interval_s * 4))
    while not stop.wait(interval_s):
        try:
            if hold(client, key, me, ttl):
                job()
        except Exception:
            log.warning("periodic job %s failed", key, exc_info=True)


def start(
    name: str, client: redis.Redis, key: str, me: str, interval_s: float, job: Callable[[], object]
) -> None:
    thread = threading.Thread(
        target=run_as_leader,
        args=(client, key, me, interval_s, job, threading.Event()),
        name=name,
        daemon=True,
    )
    thread.start()

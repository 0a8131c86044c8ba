"""Periodic jobs that one worker process at a time should run, elected by a Redis lease."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

log = logging.getLogger(__name__)

FAILURE_LOG_EVERY_S = 60.0


# Take the lease from `holder` only if it still holds it (no other process took it meanwhile).
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def dead_here(holder: str) -> bool:
    """True when `holder` (host:pid) was a process of this host that no longer exists."""
    host, _, pid = holder.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def held(client: redis.Redis, key: str) -> bool:
    """Whether a live process holds the lease `key` (one that died on this host holds nothing)."""
    raw = client.get(key)
    holder = raw.decode() if isinstance(raw, bytes) else None
    return holder is not None and not dead_here(holder)


def hold(client: redis.Redis, key: str, me: str, ttl_s: int) -> bool:
    """Take or keep the lease `key`; True while this process holds it.

    A worker restarted after a crash takes over from its dead predecessor at once instead of
    waiting out the lease, so recovery does not pay that wait.
    """
    if client.set(key, me, nx=True, ex=ttl_s):
        return True
    raw = client.get(key)
    holder = raw.decode() if isinstance(raw, bytes) else None
    if holder == me:
        client.expire(key, ttl_s)
        return True
    if holder is not None and dead_here(holder):
        return bool(client.eval(_TAKE_OVER, 1, key, holder, me, ttl_s))
    return False


def run_as_leader(
    client: redis.Redis,
    key: str,
    me: str,
    interval_s: float,
    job: Callable[[], object],
    stop: threading.Event,
) -> None:
    """Run `job` now and then every `interval_s` while holding the lease; an outage only skips a round.

    The first round runs at once: the reconciler's first round also marks the broker's epoch, and
    until it has, documents submitted to a fresh broker would look like work a flush lost.
    """
    ttl = max(2, int(interval_s * 4))
    failing = _Failures(key)
    while True:
        try:
            if hold(client, key, me, ttl):
                job()
            failing.ended()
        except Exception:  # noqa: BLE001  (an outage or a bug: either only skips a round)
            failing.seen()
        if stop.wait(interval_s):
            return


class _Failures:
    """A job's failing rounds, logged when they start (with the traceback), then once a minute, then
    when a round works again: a Redis outage would otherwise log the feeder's five rounds a second."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.count = 0
        self.logged_at = 0.0

    def seen(self) -> None:
        self.count += 1
        now = time.monotonic()
        if self.count == 1 or now - self.logged_at >= FAILURE_LOG_EVERY_S:
            log.warning(
                "periodic job %s failed (%d rounds in a row)", self.key, self.count, exc_info=self.count == 1
            )
            self.logged_at = now

    def ended(self) -> None:
        if self.count:
            log.warning("periodic job %s works again after %d failed rounds", self.key, self.count)
        self.count = 0


@dataclass
class PeriodicJob:
    """A leader-elected job's thread, stopped on a clean shutdown before its lease is given up."""

    client: redis.Redis
    key: str
    me: str
    thread: threading.Thread
    stopped: threading.Event

    def stop(self, timeout_s: float) -> None:
        """End the loop (a round under way finishes first), then give the lease up so another worker
        takes the job over at its next round; a loop still running would only take it back."""
        self.stopped.set()
        self.thread.join(timeout_s)
        if not self.thread.is_alive():
            self.client.eval(_RELEASE, 1, self.key, self.me)


def start(
    name: str, client: redis.Redis, key: str, me: str, interval_s: float, job: Callable[[], object]
) -> PeriodicJob:
    stopped = threading.Event()
    thread = threading.Thread(
        target=run_as_leader,
        args=(client, key, me, interval_s, job, stopped),
        name=name,
        daemon=True,
    )
    thread.start()
    return PeriodicJob(client, key, me, thread, stopped)

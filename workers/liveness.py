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

import redis

log = logging.getLogger(__name__)

WORKERS_KEY = "ragline:workers"


def beat(client: redis.Redis, me: str) -> None:
    client.hset(WORKERS_KEY, me, str(time.time()))


def leave(client: redis.Redis, me: str) -> None:
    """A clean shutdown: the worker's reserved tasks went back to the queue, nothing to recover."""
    client.hdel(WORKERS_KEY, me)


def forget_dead(client: redis.Redis, silent_s: float) -> list[str]:
    """Workers silent for `silent_s` seconds, removed from the hash (each is reported once)."""
    now = time.time()
    raw = client.hgetall(WORKERS_KEY)
    seen = raw if isinstance(raw, dict) else {}
    dead = [_text(name) for name, at in seen.items() if now - float(at) > silent_s]
    if dead:
        client.hdel(WORKERS_KEY, *dead)
    return dead


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def start(client: redis.Redis, me: str, interval_s: float) -> None:
    def run() -> None:
        while True:
            try:
                beat(client, me)
            except redis.RedisError:
                log.warning("worker heartbeat failed; retrying", exc_info=True)
            time.sleep(interval_s)

    threading.Thread(target=run, name="ragline-liveness", daemon=True).start()

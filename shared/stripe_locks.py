"""Shared and exclusive locks on the stripes of a blob store, held in Redis, for processes on any host.

The local blob store locks a stripe with flock, which holds only among the processes of one host;
a store that several hosts share (S3) locks it here instead, with the same semantics: many shared
holders at once or one exclusive holder, a bounded wait (then `TransientError`, so the caller
retries rather than waits without end), and release when the holder ends. A process that dies
cannot release, so every hold expires after `ttl_s` unless renewed: one thread per process renews
what the process holds, so a live holder keeps its lock however long its registry write takes, and
a dead one blocks the stripe for `ttl_s` at most. Expiry times are Redis's own clock, never a
host's, so hosts with skewed clocks agree.

Keys: `<namespace>:<stripe>:w` holds the exclusive holder's token; `<namespace>:<stripe>:r` is a
sorted set of the shared holders' tokens scored by their expiry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator

import redis

from shared.errors import TransientError

log = logging.getLogger(__name__)

_NOW = "local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "

# KEYS: writer, readers; ARGV: token, ttl_ms. 1 when taken.
_TAKE_SHARED = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""
)
_TAKE_EXCLUSIVE = (
    _NOW
    + """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""
)
# 1 when still held (and now renewed), 0 when the hold expired and may be another's.
_RENEW_SHARED = (
    _NOW
    + """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not expiry or tonumber(expiry) < now then return 0 end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
"""
)
_RENEW_EXCLUSIVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""
_DROP_SHARED = (
    _NOW
    + """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if not expiry or tonumber(expiry) < now then return 0 end
return 1
"""
)
_DROP_EXCLUSIVE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
"""


class StripeLocks:
    """Shared/exclusive locks on named stripes under one namespace (see the module docstring)."""

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        *,
        ttl_s: float = 30.0,
        wait_s: float = 30.0,
        poll_s: float = 0.01,
        busy: str = "the blob store is busy; retry shortly",
    ) -> None:
        self._redis = client
        self._busy = busy
        self._namespace = namespace
        self._ttl_ms = int(ttl_s * 1000)
        self._wait_s = wait_s
        self._poll_s = poll_s
        self._scripts = {
            name: client.register_script(source)
            for name, source in {
                "take_shared": _TAKE_SHARED,
                "take_exclusive": _TAKE_EXCLUSIVE,
                "renew_shared": _RENEW_SHARED,
                "renew_exclusive": _RENEW_EXCLUSIVE,
                "drop_shared": _DROP_SHARED,
                "drop_exclusive": _DROP_EXCLUSIVE,
            }.items()
        }
        self._held: dict[str, tuple[str, list[str]]] = {}  # token -> (kind, keys)
        self._guard = threading.Lock()
        self._renewer: threading.Thread | None = None
        self._pid = os.getpid()

    def shared(self, stripe: str) -> contextlib.AbstractContextManager[None]:
        return self._hold(stripe, "shared")

    def exclusive(self, stripe: str) -> contextlib.AbstractContextManager[None]:
        return self._hold(stripe, "exclusive")

    def _keys(self, stripe: str) -> list[str]:
        return [f"{self._namespace}:{stripe}:w", f"{self._namespace}:{stripe}:r"]

    @contextlib.contextmanager
    def _hold(self, stripe: str, kind: str) -> Iterator[None]:
        keys, token = self._keys(stripe), uuid.uuid4().hex
        deadline = time.monotonic() + self._wait_s
        while not self._scripts[f"take_{kind}"](keys=keys, args=[token, self._ttl_ms]):
            if time.monotonic() > deadline:
                raise TransientError(self._busy)
            time.sleep(self._poll_s)
        self._track(token, kind, keys)
        try:
            yield
        finally:
            self._untrack(token)
            kept = self._scripts[f"drop_{kind}"](keys=keys, args=[token])
        if not kept:
            # Not renewed in time (Redis was unreachable for longer than the expiry): another
            # process may have held the stripe meanwhile, so what was done under it is in doubt.
            log.error("the %s lock on blob stripe %s expired while held", kind, stripe)
            if kind == "shared":
                raise TransientError("the blob store's lock expired during the upload; send it again")

    def _track(self, token: str, kind: str, keys: list[str]) -> None:
        with self._guard:
            if self._pid != os.getpid():  # a forked child: the parent's holds and thread are not its own
                self._pid, self._held, self._renewer = os.getpid(), {}, None
            self._held[token] = (kind, keys)
            if self._renewer is None or not self._renewer.is_alive():
                self._renewer = threading.Thread(
                    target=self._renew_while_held, name="stripe-locks", daemon=True
                )
                self._renewer.start()

    def _untrack(self, token: str) -> None:
        with self._guard:
            self._held.pop(token, None)

    def _renew_while_held(self) -> None:
        """Renew every hold a third of the expiry apart; the thread ends when none is left."""
        while True:
            time.sleep(self._ttl_ms / 3000)
            with self._guard:
                held = list(self._held.items())
                if not held:
                    self._renewer = None
                    return
            for token, (kind, keys) in held:
                try:
                    if not self._scripts[f"renew_{kind}"](keys=keys, args=[token, self._ttl_ms]):
                        log.error("the %s lock %s expired before it was renewed", kind, keys[0])
                except redis.RedisError as error:
                    log.warning("could not renew the lock %s: %s", keys[0], type(error).__name__)

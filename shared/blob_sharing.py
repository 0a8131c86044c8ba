"""Whether a front's blob store is the one the running workers read.

A front (the API, `ragline mcp`, a local bulk load) stores a document's bytes and a worker reads
them back. Started with another state dir or bucket than the workers', a front would accept
documents that no worker can read: each said `queued`, then failed RETRIES_EXHAUSTED a minute
later. So every store has an id (`BlobStore.identity`), each worker announces its store's with its
heartbeat, and a front refuses to store bytes while live workers announce only other stores.

Where no live worker announces one (none is running, or all predate the announcement), there is
nothing to compare and documents are accepted, to wait for a worker as they always have.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import redis

from shared.blobs import IDENTITY_MAX_CHARS, BlobStore
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)

STORES_KEY = "ragline:worker-blob-stores"  # worker name -> {"store": id, "at": epoch seconds}
# How long a front trusts its last answer: a check per upload would cost two reads each.
FRESH_S = 5.0
UNKNOWN_FRESH_S = 1.0
FIRST_ANSWER_WAIT_S = 10.0  # past Redis's and a store's own bounds on one question, mostly
MAX_ANNOUNCEMENT_BYTES = 256
# The ids a front has read from its own store lately: one deleted and begun anew under a running
# stack keeps its old id in the workers' announcements until they read it again (each beat).
KEPT_OWN_IDS = 4


def announce(client: redis.Redis, worker: str, store_id: str) -> None:
    client.hset(STORES_KEY, worker, json.dumps({"store": store_id, "at": time.time()}))


def forget(client: redis.Redis, *workers: str) -> None:
    if workers:
        client.hdel(STORES_KEY, *workers)


def live_stores(client: redis.Redis, silent_s: float) -> set[str]:
    """The stores that workers heard from within `silent_s` read (give or take as much of clock
    skew between hosts: an announcement from further ahead would never age out)."""
    raw = client.hgetall(STORES_KEY)
    now, stores = time.time(), set()
    for value in (raw if isinstance(raw, dict) else {}).values():
        if len(value) > MAX_ANNOUNCEMENT_BYTES:
            continue  # no announcement is this long
        try:
            entry = json.loads(value)
            if abs(now - float(entry["at"])) <= silent_s:
                stores.add(str(entry["store"])[:IDENTITY_MAX_CHARS])
        except (ValueError, TypeError, KeyError):
            continue  # not an announcement of this version: nothing to compare
    return stores


class NotTheWorkersStore(RaglineError):
    code = ErrorCode.UNAVAILABLE


class SharedBlobs:
    """A front's check that its blob store is its workers'. One caller asks at a time, with no
    lock held while it does: the others go by the last answer meanwhile, so a slow Redis or store
    holds one upload, not every upload in turn. Before the first answer there is none to go by,
    and the others wait for it (a bounded while): a burst on a fresh front went through unchecked."""

    def __init__(self, blobs: BlobStore, client: redis.Redis, silent_s: float) -> None:
        self.blobs = blobs
        self.client = client
        self.silent_s = silent_s
        self._lock = threading.Lock()
        self._answered = threading.Condition(self._lock)
        self._answer: tuple[float, bool | None] | None = None  # (good until, shared)
        self._asking = False
        # Id -> when this front last read it as its store's; written by the one caller asking.
        self._own_ids: dict[str, float] = {}
        self._unknown = False  # the last answer was unknown (and said so in the log)

    def check(self) -> None:
        """Raise NotTheWorkersStore when the live workers read other stores than this front's."""
        with self._lock:
            until, shared = self._answer or (0.0, None)
            ask = time.monotonic() >= until and not self._asking
            if ask:
                self._asking = True
            elif self._answer is None:
                self._answered.wait_for(lambda: self._answer is not None, timeout=FIRST_ANSWER_WAIT_S)
                until, shared = self._answer or (0.0, None)
        if ask:
            try:
                shared = self._shared()
            finally:
                with self._lock:
                    self._asking = False
                    # No answer (Redis or the store away) is asked again soon, not at each upload.
                    fresh = FRESH_S if shared is not None else UNKNOWN_FRESH_S
                    self._answer = (time.monotonic() + fresh, shared)
                    self._answered.notify_all()
        if shared is False:
            raise NotTheWorkersStore(
                "this server keeps uploaded bytes in a blob store that none of the running workers "
                "reads, so no document sent to it could be processed; run this server (the API, or "
                "`ragline mcp`) with the workers' RAGLINE_STATE_DIR (or RAGLINE_BLOBS__URL)"
            )

    def _log_unknown(self, error: Exception) -> None:
        """Once an outage, not at each ask while it lasts; an outage is reported where a request
        meets it, so only an unexpected error needs its stack in the log."""
        if not self._unknown:
            stack = not isinstance(error, redis.RedisError | RaglineError)
            log.warning("could not compare the blob store with the workers': %s", error, exc_info=stack)
        self._unknown = True

    def _lately_own(self, mine: str) -> list[str]:
        """`mine` and the ids this front read as its store's within the worker-silence window: an
        id is announced for at most that long after its store began anew, whereas a store that
        holds it now is another one (its id file copied)."""
        now = time.monotonic()
        self._own_ids.pop(mine, None)
        self._own_ids[mine] = now
        recent = [i for i, seen in self._own_ids.items() if now - seen <= self.silent_s]
        self._own_ids = {i: self._own_ids[i] for i in recent[-KEPT_OWN_IDS:]}
        return list(self._own_ids)

    def _shared(self) -> bool | None:
        """None: unknown, as Redis or the store did not answer (the request meets that outage in
        its own words, or the upload goes through to wait for a worker as before)."""
        try:
            stores = live_stores(self.client, self.silent_s)
            if not stores:
                self._unknown = False
                return True
            mine = self.blobs.identity()
        except Exception as error:  # noqa: BLE001  (whatever the store or Redis raised: unknown)
            self._log_unknown(error)
            return None
        self._unknown = False
        if stores.intersection(self._lately_own(mine)):
            return True
        log.error(
            "the blob store %s (id %s) is not the one the running workers read (ids %s): documents "
            "are refused until this process runs with the workers' RAGLINE_STATE_DIR or RAGLINE_BLOBS__URL",
            self.blobs.location,
            mine,
            ", ".join(sorted(stores)[:5]) + (f" and {len(stores) - 5} more" if len(stores) > 5 else ""),
        )
        return False

"""Readiness: OpenSearch, Redis, the blob store and at least one worker answer, asked without ever
blocking the API.

Each dependency is asked by a `SingleFlight` of its own: a burst of probes shares one question in
flight and its answer, no probe takes a thread the routes need, and a dependency that does not
answer in time reads as not ready (`TIMEOUT`) while the others still report.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
from celery import Celery
from opensearchpy import OpenSearch

from services.api.single_flight import SingleFlight
from services.core.container import AppState
from shared.blob_sharing import NotTheWorkersStore, SharedBlobs
from shared.blobs import BlobStore
from shared.config import Settings
from shared.queue import ping_workers
from shared.search.client import cluster_status

# Each dependency's own bound on one question (a request timeout, socket timeouts, a ping).
ASK_TIMEOUT_S = 2.0
PING_TIMEOUT_S = 1.0
# A probe waits this long for the answers, past the bounds above; a burst shares one answer this long.
WAIT_S = 3.0
FRESH_S = 1.0

Check = dict[str, Any]


def bounded_redis(settings: Settings) -> redis.Redis:
    """A Redis client whose every wait is bounded, for probes and scrapes (the shared one has none)."""
    return redis.Redis.from_url(
        settings.redis.url, socket_timeout=ASK_TIMEOUT_S, socket_connect_timeout=ASK_TIMEOUT_S
    )


def _asked(question: Callable[[], Check]) -> Callable[[], Check]:
    def ask() -> Check:
        try:
            return question()
        except Exception as error:  # noqa: BLE001  (a probe reports a failure, it never raises one)
            return {"ok": False, "error": type(error).__name__}

    return ask


def _opensearch(client: OpenSearch) -> Check:
    status = cluster_status(client, ASK_TIMEOUT_S)
    return {"ok": status in ("green", "yellow"), "status": status}


def _redis(client: redis.Redis) -> Check:
    return {"ok": bool(client.ping())}


def _workers(sender: Celery) -> Check:
    replies = ping_workers(sender, timeout_s=PING_TIMEOUT_S)
    return {"ok": bool(replies), "count": len(replies)}


def _blobs(store: BlobStore, shared: SharedBlobs) -> Check:
    """The store can serve: its directory is writable, or its bucket answers and exists, and it is
    the one the live workers read (what is wrong is logged and told to the requests that meet it,
    not to a public probe)."""
    store.check()
    try:
        shared.check()
    except NotTheWorkersStore:
        return {"ok": False, "error": "NOT_THE_WORKERS_STORE"}
    return {"ok": True}


def _late() -> Check:
    return {"ok": False, "error": "TIMEOUT"}


class Readiness:
    def __init__(self, state: AppState) -> None:
        probe_redis = bounded_redis(state.settings)
        shared = SharedBlobs(state.blobs, probe_redis, state.settings.celery.worker_silent_s)
        questions: dict[str, Callable[[], Check]] = {
            "opensearch": lambda: _opensearch(state.client),
            "redis": lambda: _redis(probe_redis),
            "workers": lambda: _workers(state.sender),
            "blobs": lambda: _blobs(state.blobs, shared),
        }
        self._checks = {
            name: SingleFlight(_asked(question), fresh_s=FRESH_S, wait_s=WAIT_S, late=_late)
            for name, question in questions.items()
        }

    async def answer(self) -> dict[str, Any]:
        """`{"ready": bool, "checks": {dependency: {"ok": bool, ...}}}`."""
        answers = await asyncio.gather(*(check.get() for check in self._checks.values()))
        checks = dict(zip(self._checks, answers, strict=True))
        return {"ready": all(c["ok"] for c in checks.values()), "checks": checks}

"""Per-process resources of a worker, built lazily once after fork."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.blobs import BlobStore
from shared.config import Settings, get_settings
from shared.queue import broker_client, redis_client
from shared.registry import Registry
from shared.search.client import build_client
from shared.search.schema import ensure_indexes


@dataclass(frozen=True)
class WorkerContext:
    settings: Settings
    client: OpenSearch
    registry: Registry
    blobs: BlobStore
    sender: Celery
    redis: redis.Redis


@lru_cache(maxsize=1)
def worker_context() -> WorkerContext:
    settings = get_settings()
    client = build_client(settings.opensearch)
    ensure_indexes(client, settings)
    return WorkerContext(
        settings=settings,
        client=client,
        registry=Registry(client, settings),
        blobs=BlobStore(settings.state_dir / "blobstore"),
        sender=broker_client(settings),
        redis=redis_client(settings),
    )


# A pool process forked after the main process built its context (Celery replaces a pool process
# after a broker outage, for instance) would inherit its OpenSearch sockets: two processes on one
# connection read each other's responses. Every forked child builds its own.
os.register_at_fork(after_in_child=worker_context.cache_clear)

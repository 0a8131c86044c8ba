"""Per-process resources of a worker, built lazily once after fork."""

from __future__ import annotations

import logging
import os
from functools import lru_cache

from shared.blobs import BlobStore
from shared.config import get_settings
from shared.errors import RaglineError
from shared.wiring import Services, build_services

log = logging.getLogger(__name__)

# What a stage sees: the process's services (registry, blobs, sender, Redis, ...).
WorkerContext = Services


@lru_cache(maxsize=1)
def worker_context() -> WorkerContext:
    services = build_services(get_settings())
    services.prepare_indexes()
    report_blob_store(services.blobs)
    return services


def report_blob_store(blobs: BlobStore) -> None:
    """Name in the log, as the worker starts, a blob store that cannot serve (a bucket that does
    not exist, refused credentials): the documents waiting on it say only that it is unavailable."""
    try:
        blobs.check()
    except RaglineError as error:
        log.error("the blob store cannot serve: %s", error.message)


# A pool process forked after the main process built its context (Celery replaces a pool process
# after a broker outage, for instance) would inherit its OpenSearch sockets: two processes on one
# connection read each other's responses. Every forked child builds its own.
os.register_at_fork(after_in_child=worker_context.cache_clear)

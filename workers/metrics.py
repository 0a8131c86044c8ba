"""Prometheus metrics of a worker, served on RAGLINE_METRICS__WORKER_PORT by the worker's main process.

Why multiprocess mode: Celery's prefork pool runs tasks in child processes, so the figures are
made there, while the one HTTP endpoint lives in the main process (children come and go, and a
port per child could not be scraped). With PROMETHEUS_MULTIPROC_DIR set, every process writes its
values to its own mmap'd file in that directory and the main process sums them at scrape time;
a replaced child's counts stay in its file, as counters must. `ragline worker` sets the variable
to a fresh directory before Celery starts, since prometheus_client picks the mode at import.
Without it (a worker started some other way) only the main process's own figures would show,
which the endpoint says in its log line at start.

Labels stay bounded: stage, outcome, status and error code are small enums. No tenant, kb or
document id: those grow with the data, and the logs carry them instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from time import perf_counter, process_time

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

from shared.config import Settings
from shared.queue import all_queues, redis_client
from shared.queue_metrics import QueueDepthCollector

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

STAGE_SECONDS = Histogram(
    "ragline_worker_stage_duration_seconds",
    "Time a document spent in a pipeline stage (a batched stage's time is shared by chunk count).",
    ["stage", "outcome"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0),
)
DOCUMENTS = Counter(
    "ragline_worker_documents", "Documents this worker finished, by final status.", ["status"]
)
FAILURES = Counter(
    "ragline_worker_failures", "Documents failed for good, by stage and error code.", ["stage", "code"]
)
RETRIES = Counter(
    "ragline_worker_retries", "Stage tasks sent again after a transient error.", ["stage", "code"]
)
EMBED_BATCH_CHUNKS = Histogram(
    "ragline_worker_embed_batch_chunks",
    "Chunks per embedding batch (cached ones included), across the documents of the batch.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096),
)
EMBED_BATCH_DOCUMENTS = Histogram(
    "ragline_worker_embed_batch_documents",
    "Documents per embedding batch.",
    buckets=(1, 2, 4, 8, 16, 32),
)
EMBED_CHUNKS = Counter("ragline_worker_embed_chunks", "Chunks embedded, by source of the vector.", ["source"])
MODEL_CPU_METRIC = "ragline_worker_embed_model_cpu_seconds"  # exposed with "_total", as counters are
EMBED_MODEL_CPU = Counter(
    MODEL_CPU_METRIC,
    "CPU seconds the embedding model's encode calls took (tokenizing and the model's threads); "
    "the rest of the worker's CPU is the pipeline's own work.",
)
BULK_SECONDS = Histogram(
    "ragline_worker_opensearch_bulk_seconds",
    "Latency of one OpenSearch bulk request of the store stage.",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)


def stage_observed(stage: str, outcome: str, seconds: float) -> None:
    """outcome: ok (handed on), retry (sent again later) or failed."""
    STAGE_SECONDS.labels(stage, outcome).observe(seconds)


def document_failed(stage: str, code: str) -> None:
    FAILURES.labels(stage, code).inc()
    DOCUMENTS.labels("failed").inc()


def document_ready() -> None:
    DOCUMENTS.labels("ready").inc()


def retried(stage: str, code: str) -> None:
    RETRIES.labels(stage, code).inc()


def embed_batch(documents: int, chunks: int, encoded: int) -> None:
    EMBED_BATCH_DOCUMENTS.observe(documents)
    EMBED_BATCH_CHUNKS.observe(chunks)
    EMBED_CHUNKS.labels("encoded").inc(encoded)
    EMBED_CHUNKS.labels("cache").inc(chunks - encoded)


@contextmanager
def model_cpu() -> Iterator[None]:
    """Counts the process's CPU time while the block runs: the encoder's intra-op threads are this
    process's, and the worker's other threads wait on I/O meanwhile."""
    started = process_time()
    try:
        yield
    finally:
        EMBED_MODEL_CPU.inc(process_time() - started)


@contextmanager
def bulk_request() -> Iterator[None]:
    started = perf_counter()
    try:
        yield
    except BaseException:
        BULK_SECONDS.labels("error").observe(perf_counter() - started)
        raise
    BULK_SECONDS.labels("ok").observe(perf_counter() - started)


def scrape_registry(settings: Settings) -> CollectorRegistry:
    """What the endpoint serves: every pool process's figures plus the queue depth read from Redis."""
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = REGISTRY
    registry.register(
        QueueDepthCollector(
            redis_client(settings),
            all_queues(settings),
            tenant_labels=settings.metrics.tenant_labels,
        )
    )
    return registry


def serve(settings: Settings) -> None:
    """Start the endpoint in a thread of the main process; a busy port costs the metrics, not the worker."""
    host, port = settings.metrics.worker_host, settings.metrics.worker_port
    if port == 0:
        return
    try:
        start_http_server(port, addr=host, registry=scrape_registry(settings))
    except OSError as error:
        log.error("worker metrics: cannot listen on %s:%d (%s); serving none", host, port, error)
        return
    scope = (
        "all pool processes" if os.environ.get(MULTIPROC_ENV) else f"this process only (no {MULTIPROC_ENV})"
    )
    log.info("worker metrics on http://%s:%d/metrics (%s)", host, port, scope)

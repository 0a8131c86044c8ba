"""Prometheus metrics of the API: request latency, documents by status, queue depth, stage durations.

Labels stay bounded: the route is the path template (never the path with its ids), method and
status are small sets. There is no tenant label: tenants grow with the deployment, and one series
per tenant and route would too; the request logs carry the tenant instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import redis
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api.readiness import ASK_TIMEOUT_S, bounded_redis
from services.api.single_flight import SingleFlight
from services.core.container import AppState
from services.core.envelope import envelope
from shared.errors import ErrorCode
from shared.queue import all_queues
from shared.queue_metrics import QueueDepthCollector
from shared.stage_metrics import read_stage_histograms

log = logging.getLogger(__name__)

# Counting documents by status is an aggregation over the registry: a burst of scrapes (several
# Prometheus servers, a dashboard) shares one answer for this long.
STATUS_CACHE_S = 5.0
# A burst of scrapes shares one exposition in flight and for this long after; a scrape waits this
# long at most (every backing call is bounded shorter) and is answered UNAVAILABLE past it.
EXPOSITION_FRESH_S = 1.0
EXPOSITION_WAIT_S = 5.0


class LiveCollector(Collector):
    """Figures read from OpenSearch and Redis at scrape time, so every API replica reports the same."""

    def __init__(self, state: AppState, client: redis.Redis) -> None:
        self.state = state
        self.redis = client
        self._statuses: tuple[float, dict[str, int]] | None = None

    def _by_status(self) -> dict[str, int]:
        now = time.monotonic()
        if self._statuses is not None and now - self._statuses[0] < STATUS_CACHE_S:
            return self._statuses[1]
        counts = self.state.registry.status_counts(request_timeout=ASK_TIMEOUT_S)
        self._statuses = (now, counts)
        return counts

    def collect(self) -> Iterable[Metric]:
        docs = GaugeMetricFamily("ragline_documents", "Documents by status.", labels=["status"])
        stages = HistogramMetricFamily(
            "ragline_stage_duration_seconds", "Time per pipeline stage, all workers.", labels=["stage"]
        )
        try:
            for status, count in self._by_status().items():
                docs.add_metric([status], count)
            for stage, (buckets, total) in read_stage_histograms(self.redis).items():
                stages.add_metric([stage], buckets=buckets, sum_value=total)
        except Exception:  # noqa: BLE001  (a scrape must answer even while a dependency is down)
            log.warning("metrics: a backing service did not answer")
        yield from (docs, stages)


class Metrics:
    def __init__(self, state: AppState) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "ragline_http_request_duration_seconds",
            "HTTP request latency.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        scrapes = bounded_redis(state.settings)
        self.registry.register(LiveCollector(state, scrapes))
        self.registry.register(
            QueueDepthCollector(
                scrapes, all_queues(state.settings), tenant_labels=state.settings.metrics.tenant_labels
            )
        )
        self._exposition: SingleFlight[bytes | None] = SingleFlight(
            lambda: generate_latest(self.registry),
            fresh_s=EXPOSITION_FRESH_S,
            wait_s=EXPOSITION_WAIT_S,
            late=lambda: None,
        )

    def observe(self, method: str, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        self.latency.labels(method, getattr(route, "path", "unmatched"), str(status)).observe(seconds)

    async def render(self) -> Response:
        exposition = await self._exposition.get()
        if exposition is None:
            return envelope(ErrorCode.UNAVAILABLE, "the metrics could not be gathered in time; retry")
        return Response(exposition, media_type="text/plain; version=0.0.4")


class RequestLatency:
    """Times each request until its response starts (pure ASGI: Starlette's BaseHTTPMiddleware
    runs every response through a task group and memory streams, a streamed MCP answer most)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        observed = False

        async def timed(message: Message) -> None:
            nonlocal observed
            if message["type"] == "http.response.start" and not observed:
                observed = True
                self.metrics.observe(scope["method"], scope, message["status"], time.perf_counter() - started)
            await send(message)

        try:
            await self.app(scope, receive, timed)
        except Exception:
            if not observed:  # the server's error handler answers 500 outside this middleware
                self.metrics.observe(scope["method"], scope, 500, time.perf_counter() - started)
            raise

"""Prometheus metrics of the API: request latency, documents by status, queue depth, stage durations."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from services.api.state import AppState
from shared.stage_metrics import read_stage_histograms

log = logging.getLogger(__name__)


class LiveCollector(Collector):
    """Figures read from OpenSearch and Redis at scrape time, so every API replica reports the same."""

    def __init__(self, state: AppState) -> None:
        self.state = state

    def collect(self) -> Iterable[Metric]:
        docs = GaugeMetricFamily("ragline_documents", "Documents by status.", labels=["status"])
        queues = GaugeMetricFamily("ragline_queue_depth", "Tasks waiting per queue.", labels=["queue"])
        stages = HistogramMetricFamily(
            "ragline_stage_duration_seconds", "Time per pipeline stage.", labels=["stage"]
        )
        try:
            response = self.state.client.search(
                index=self.state.registry.docs,
                body={"size": 0, "aggs": {"status": {"terms": {"field": "status", "size": 20}}}},
            )
            for bucket in response["aggregations"]["status"]["buckets"]:
                docs.add_metric([bucket["key"]], bucket["doc_count"])
            for queue in self.state.settings.celery.queues:
                queues.add_metric([queue], int(self.state.redis.llen(queue)))
            for stage, (buckets, total) in read_stage_histograms(self.state.redis).items():
                stages.add_metric([stage], buckets=buckets, sum_value=total)
        except Exception:  # noqa: BLE001  (a scrape must answer even while a dependency is down)
            log.warning("metrics: a backing service did not answer")
        yield from (docs, queues, stages)


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
        self.registry.register(LiveCollector(state))

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        route = request.scope.get("route")
        template = getattr(route, "path", "unmatched")
        self.latency.labels(request.method, template, str(response.status_code)).observe(
            time.perf_counter() - started
        )
        return response

    def render(self) -> Response:
        return Response(generate_latest(self.registry), media_type="text/plain; version=0.0.4")

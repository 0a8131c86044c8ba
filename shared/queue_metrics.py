"""Queue depth read from Redis at scrape time: Celery queues and the fair bulk lanes.

Read live rather than counted, so every process that serves it (the API, each worker) reports the
same figures and nothing drifts after a crash or a flushed broker.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from shared import fairqueue

log = logging.getLogger(__name__)

# A lane is named by its tenant (and KB), so a series per lane could grow with the number of
# tenants. Only the deepest lanes get their own series; the totals cover the rest.
TOP_LANES = 10


class QueueDepthCollector(Collector):
    """`tenant_labels`: the deepest lanes get series named by tenant and KB. Off, as by default,
    since /metrics is served without a key, only figures that name nobody are exposed."""

    def __init__(self, client: redis.Redis, queues: list[str], *, tenant_labels: bool = False) -> None:
        self.client = client
        self.queues = queues
        self.tenant_labels = tenant_labels

    def collect(self) -> Iterable[Metric]:
        depth = GaugeMetricFamily("ragline_queue_depth", "Tasks waiting per Celery queue.", labels=["queue"])
        lanes_active = GaugeMetricFamily("ragline_fair_lanes", "Fair bulk lanes with waiting documents.")
        waiting = GaugeMetricFamily(
            "ragline_fair_waiting", "Bulk documents waiting in the fair lanes, all lanes together."
        )
        deepest_lane = GaugeMetricFamily(
            "ragline_fair_lane_depth_max", "Documents waiting in the deepest fair lane."
        )
        lane_depth = GaugeMetricFamily(
            "ragline_fair_lane_depth",
            f"Documents waiting in each of the {TOP_LANES} deepest fair lanes.",
            labels=["lane"],
        )
        try:
            pipe = self.client.pipeline(transaction=False)
            for queue in self.queues:
                pipe.llen(queue)
            queue_lengths = pipe.execute()
            lanes = sorted(k.decode() for k in self.client.smembers(fairqueue.LANES))  # type: ignore[union-attr]
            pipe = self.client.pipeline(transaction=False)
            for key in lanes:
                pipe.llen(key)
            lane_lengths = [int(n) for n in pipe.execute()]
        except redis.RedisError:
            # A scrape must answer while Redis is down; absent series say "unknown", not zero.
            log.warning("metrics: Redis did not answer for the queue depth")
            return
        for queue, length in zip(self.queues, queue_lengths, strict=True):
            depth.add_metric([queue], int(length))
        lanes_active.add_metric([], sum(1 for n in lane_lengths if n > 0))
        waiting.add_metric([], sum(lane_lengths))
        deepest_lane.add_metric([], max(lane_lengths, default=0))
        yield from (depth, lanes_active, waiting, deepest_lane)
        if self.tenant_labels:
            deepest = sorted(zip(lane_lengths, lanes, strict=True), reverse=True)[:TOP_LANES]
            for length, key in deepest:
                if length > 0:
                    lane_depth.add_metric([key.removeprefix("ragline:fair:lane:")], length)
            yield lane_depth

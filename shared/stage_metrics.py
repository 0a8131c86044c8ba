"""Per-stage duration histograms kept in Redis, written by workers and read by any API process.

A stage's observation increments only the one bucket its duration falls in (and the sum); the
reader adds the buckets up into Prometheus' cumulative form. Incrementing every bucket at or above
the duration, as the cumulative form stores it, sent up to 14 commands for each stage of each
document, a cost the worker paid on every hand-over. A worker process gathers its observations in
a `StageTimes` and writes them in one round trip, not one for each stage of each document.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter

import redis

# Not the key of the cumulative layout this one replaced: its counts would be summed again.
KEY = "ragline:metrics:stage_seconds:buckets"
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def bucket_of(seconds: float) -> str:
    """The label of the least bound at or above `seconds` ("+Inf" past the last)."""
    index = bisect.bisect_left(STAGE_BUCKETS, seconds)
    return str(STAGE_BUCKETS[index]) if index < len(STAGE_BUCKETS) else "+Inf"


class StageTimes:
    """Observations of one process not yet written: bucket increments and sums by field."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._sums: dict[str, float] = {}

    def observe(self, stage: str, seconds: float) -> None:
        if not math.isfinite(seconds):
            return  # Redis refuses such a sum after counting its bucket: count and sum would part
        self._counts[f"{stage}|{bucket_of(seconds)}"] += 1
        field = f"{stage}|sum"
        self._sums[field] = self._sums.get(field, 0.0) + seconds

    def flush(self, client: redis.Redis) -> None:
        """Write what was observed since the last flush; what a failed write held is dropped, as a
        metric never fails or holds up a document."""
        if not self._counts:
            return
        counts, sums = self._counts, self._sums
        self._counts, self._sums = Counter(), {}
        pipe = client.pipeline(transaction=False)
        for field, count in counts.items():
            pipe.hincrby(KEY, field, count)
        for field, seconds in sums.items():
            pipe.hincrbyfloat(KEY, field, seconds)
        pipe.execute()


def cumulative(raw: dict[str, float]) -> dict[str, tuple[list[tuple[str, float]], float]]:
    """stage -> (cumulative buckets as (upper bound, count), sum of seconds), from the stored
    per-bucket counts ("stage|bound" and "stage|sum" fields)."""
    stages = {field.rsplit("|", 1)[0] for field in raw}
    out = {}
    for stage in sorted(stages):
        buckets: list[tuple[str, float]] = []
        running = 0.0
        for bound in [*map(str, STAGE_BUCKETS), "+Inf"]:
            running += raw.get(f"{stage}|{bound}", 0.0)
            buckets.append((bound, running))
        out[stage] = (buckets, raw.get(f"{stage}|sum", 0.0))
    return out


def read_stage_histograms(client: redis.Redis) -> dict[str, tuple[list[tuple[str, float]], float]]:
    """stage -> (cumulative buckets as (upper bound, count), sum of seconds)."""
    raw = {k.decode(): float(v) for k, v in client.hgetall(KEY).items()}  # type: ignore[union-attr]
    return cumulative(raw)

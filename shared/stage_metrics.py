"""Per-stage duration histograms kept in Redis, written by workers and read by any API process."""

from __future__ import annotations

import redis

KEY = "ragline:metrics:stage_seconds"
STAGE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def record_stage(client: redis.Redis, stage: str, seconds: float) -> None:
    pipe = client.pipeline(transaction=False)
    for bound in STAGE_BUCKETS:
        if seconds <= bound:
            pipe.hincrby(KEY, f"{stage}|{bound}", 1)
    pipe.hincrby(KEY, f"{stage}|+Inf", 1)
    pipe.hincrbyfloat(KEY, f"{stage}|sum", seconds)
    pipe.execute()


def read_stage_histograms(client: redis.Redis) -> dict[str, tuple[list[tuple[str, float]], float]]:
    """stage -> (cumulative buckets as (upper bound, count), sum of seconds)."""
    raw = {k.decode(): float(v) for k, v in client.hgetall(KEY).items()}  # type: ignore[union-attr]
    stages = {field.split("|", 1)[0] for field in raw}
    out = {}
    for stage in sorted(stages):
        buckets = [(str(b), raw.get(f"{stage}|{b}", 0.0)) for b in STAGE_BUCKETS]
        buckets.append(("+Inf", raw.get(f"{stage}|+Inf", 0.0)))
        out[stage] = (buckets, raw.get(f"{stage}|sum", 0.0))
    return out

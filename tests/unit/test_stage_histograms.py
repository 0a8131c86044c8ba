"""The stage histograms' layout: one bucket a observation, summed up into Prometheus' form."""

from __future__ import annotations

import math
from typing import cast

import redis

from shared.stage_metrics import STAGE_BUCKETS, bucket_of, cumulative, record_stage


def test_an_observation_falls_in_the_least_bound_at_or_above_it() -> None:
    assert bucket_of(0.0) == "0.01"
    assert bucket_of(0.01) == "0.01"
    assert bucket_of(0.0100001) == "0.05"
    assert bucket_of(300.0) == "300.0"
    assert bucket_of(300.5) == "+Inf"


def test_the_buckets_read_back_cumulative_with_every_bound_and_the_sum() -> None:
    observations = [0.003, 0.2, 0.2, 7.0, 999.0]
    raw: dict[str, float] = {}
    for seconds in observations:
        field = f"parse|{bucket_of(seconds)}"
        raw[field] = raw.get(field, 0.0) + 1
        raw["parse|sum"] = raw.get("parse|sum", 0.0) + seconds
    raw["store|0.5"] = 2.0
    raw["store|sum"] = 0.6

    histograms = cumulative(raw)

    buckets, total = histograms["parse"]
    assert [bound for bound, _ in buckets] == [*map(str, STAGE_BUCKETS), "+Inf"]
    expected = {bound: float(sum(1 for s in observations if s <= float(bound))) for bound, _ in buckets}
    assert dict(buckets) == expected
    assert buckets[-1] == ("+Inf", len(observations))
    assert total == sum(observations)
    store, store_total = histograms["store"]
    assert dict(store)["0.25"] == 0
    assert dict(store)["0.5"] == 2
    assert dict(store)["+Inf"] == 2
    assert store_total == 0.6


def test_a_stage_name_with_the_separator_keeps_its_observations() -> None:
    raw = {f"ocr|pdf|{bucket_of(0.2)}": 1.0, "ocr|pdf|sum": 0.2}
    buckets, total = cumulative(raw)["ocr|pdf"]
    assert dict(buckets)["+Inf"] == 1
    assert total == 0.2


def test_a_duration_that_is_no_number_is_not_recorded() -> None:
    class Refuses:
        def pipeline(self, transaction: bool = True) -> object:
            raise AssertionError("nothing should be sent")

    for seconds in (math.nan, math.inf, -math.inf):
        record_stage(cast(redis.Redis, Refuses()), "parse", seconds)

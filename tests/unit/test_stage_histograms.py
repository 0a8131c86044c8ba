"""The stage histograms' layout: one bucket a observation, summed up into Prometheus' form."""

from __future__ import annotations

import math
from typing import cast

import pytest
import redis

from shared.stage_metrics import KEY, STAGE_BUCKETS, StageTimes, bucket_of, cumulative


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


class Pipeline:
    def __init__(self, sent: list[tuple[str, str, str, float]]) -> None:
        self.sent = sent

    def hincrby(self, key: str, field: str, amount: int) -> None:
        self.sent.append(("hincrby", key, field, amount))

    def hincrbyfloat(self, key: str, field: str, amount: float) -> None:
        self.sent.append(("hincrbyfloat", key, field, amount))

    def execute(self) -> None:
        self.sent.append(("execute", "", "", 0))


class Client:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, float]] = []

    def pipeline(self, transaction: bool = True) -> Pipeline:
        assert not transaction
        return Pipeline(self.sent)


def test_observations_are_written_together_and_once() -> None:
    times, client = StageTimes(), Client()
    for stage, seconds in [("parse", 0.2), ("parse", 0.3), ("parse", 7.0), ("embed", 0.02)]:
        times.observe(stage, seconds)

    times.flush(cast(redis.Redis, client))

    assert client.sent[-1][0] == "execute"
    assert [c for c in client.sent if c[0] == "execute"] == [client.sent[-1]]  # one round trip
    written = {(command, field): amount for command, key, field, amount in client.sent[:-1] if key == KEY}
    assert len(written) == len(client.sent) - 1
    assert written == {
        ("hincrby", "parse|0.25"): 1,
        ("hincrby", "parse|0.5"): 1,
        ("hincrby", "parse|10.0"): 1,
        ("hincrby", "embed|0.05"): 1,
        ("hincrbyfloat", "parse|sum"): 7.5,
        ("hincrbyfloat", "embed|sum"): 0.02,
    }
    client.sent.clear()
    times.flush(cast(redis.Redis, client))
    assert client.sent == []  # written once only


def test_a_failed_write_is_not_written_again() -> None:
    class Unreachable:
        calls = 0

        def pipeline(self, transaction: bool = True) -> object:
            Unreachable.calls += 1
            raise redis.ConnectionError("down")

    times = StageTimes()
    times.observe("parse", 0.2)
    with pytest.raises(redis.ConnectionError):
        times.flush(cast(redis.Redis, Unreachable()))
    client = Client()
    times.flush(cast(redis.Redis, client))
    assert client.sent == []
    assert Unreachable.calls == 1


def test_a_duration_that_is_no_number_is_not_recorded() -> None:
    class Refuses:
        def pipeline(self, transaction: bool = True) -> object:
            raise AssertionError("nothing should be sent")

    times = StageTimes()
    for seconds in (math.nan, math.inf, -math.inf):
        times.observe("parse", seconds)
    times.flush(cast(redis.Redis, Refuses()))

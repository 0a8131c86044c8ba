"""A worker's heartbeat: a clean leave is final, so a stopped worker never looks dead."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import redis

from shared import blob_sharing
from workers import liveness


class RecordingRedis:
    """Holds each hash in a dict: the heartbeat's logic, not Redis, is under test here."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, str]] = {liveness.WORKERS_KEY: {}, blob_sharing.STORES_KEY: {}}
        self.calls: list[str] = []

    @property
    def hash(self) -> dict[str, str]:
        return self.hashes[liveness.WORKERS_KEY]

    def hset(self, key: str, field: str, value: str) -> None:
        self.calls.append("hset")
        self.hashes[key][field] = value

    def hdel(self, key: str, *fields: str) -> None:
        self.calls.append("hdel")
        for name in fields:
            self.hashes[key].pop(name, None)

    def hgetall(self, key: str) -> dict[str, str]:
        return dict(self.hashes[key])


def _heart(
    client: RecordingRedis, interval_s: float = 60, store_id: Callable[[], str] | None = None
) -> liveness.Heartbeat:
    return liveness.Heartbeat(client, "host:1", interval_s, store_id)  # type: ignore[arg-type]


def test_a_beat_after_leave_does_not_register_the_worker_again() -> None:
    client = RecordingRedis()
    heart = _heart(client)
    heart.beat()
    assert "host:1" in client.hash
    heart.leave()
    heart.beat()  # the beat thread's next turn, racing the shutdown
    assert client.hashes == {liveness.WORKERS_KEY: {}, blob_sharing.STORES_KEY: {}}
    assert client.calls == ["hset", "hdel", "hdel"]


def test_leave_stops_the_beat_thread() -> None:
    client = RecordingRedis()
    heart = _heart(client, interval_s=0.01)
    heart.start()
    threading.Event().wait(0.1)
    heart.leave()
    threads = [t for t in threading.enumerate() if t.name == "ragline-liveness"]
    for thread in threads:
        thread.join(timeout=5)
    assert not any(t.is_alive() for t in threads)
    assert client.hash == {}


def test_a_failed_beat_is_retried_not_fatal() -> None:
    class Flaky(RecordingRedis):
        def hset(self, *args: Any) -> None:
            if not self.calls:
                self.calls.append("refused")
                raise redis.ConnectionError("down")
            super().hset(*args)

    client = Flaky()
    heart = _heart(client, interval_s=0.01)
    heart.start()
    for _ in range(500):
        if "host:1" in client.hash:
            break
        threading.Event().wait(0.01)
    heart.leave()
    assert client.calls[0] == "refused"
    assert "hset" in client.calls


def test_each_announcement_reads_the_store_again_and_leave_takes_it_back() -> None:
    client = RecordingRedis()
    ids = iter(["first", "second", "third"])
    heart = _heart(client, store_id=lambda: next(ids))
    heart.announce()
    assert blob_sharing.live_stores(client, silent_s=60) == {"first"}  # type: ignore[arg-type]
    heart.announce()  # read again each time: a store begun anew has a new id
    assert blob_sharing.live_stores(client, silent_s=60) == {"second"}  # type: ignore[arg-type]
    heart.leave()
    heart.announce()  # the announcing thread's next turn, racing the shutdown
    assert blob_sharing.live_stores(client, silent_s=60) == set()  # type: ignore[arg-type]


def test_a_store_slow_or_failing_to_say_its_id_holds_no_beat() -> None:
    """The beat read the store's id first: a store slow to answer (S3 retries a read for a minute)
    held the beat past the 60 s after which a worker counts as dead; a store error no handler knew
    (an S3 redirect) ended the beat's thread for good."""
    answered = threading.Event()

    def slow_then_odd() -> str:
        answered.wait(5)
        raise ValueError("301 PermanentRedirect")

    client = RecordingRedis()
    heart = _heart(client, interval_s=0.01, store_id=slow_then_odd)
    heart.start()
    try:
        for _ in range(500):
            if client.calls.count("hset") >= 3:
                break
            threading.Event().wait(0.01)
        assert client.calls.count("hset") >= 3  # beats went on while the store did not answer
        answered.set()
        beats = client.calls.count("hset")
        threading.Event().wait(0.2)
        assert client.calls.count("hset") > beats  # and after its odd failure
        assert any(t.name == "ragline-blob-store" and t.is_alive() for t in threading.enumerate())
    finally:
        answered.set()
        heart.leave()
    assert client.hashes[blob_sharing.STORES_KEY] == {}


def test_a_dead_worker_is_forgotten_with_its_store() -> None:
    client = RecordingRedis()
    heart = _heart(client, store_id=lambda: "gone")
    heart.beat()
    heart.announce()
    client.hashes[liveness.WORKERS_KEY]["host:1"] = "0"  # its last beat, long ago
    assert liveness.forget_dead(client, silent_s=60) == ["host:1"]  # type: ignore[arg-type]
    assert client.hashes[blob_sharing.STORES_KEY] == {}

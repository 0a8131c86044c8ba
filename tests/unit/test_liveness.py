"""A worker's heartbeat: a clean leave is final, so a stopped worker never looks dead."""

from __future__ import annotations

import threading
from typing import Any

import redis

from workers import liveness


class RecordingRedis:
    """Holds the workers hash in a dict: the heartbeat's logic, not Redis, is under test here."""

    def __init__(self) -> None:
        self.hash: dict[str, str] = {}
        self.calls: list[str] = []

    def hset(self, key: str, field: str, value: str) -> None:
        assert key == liveness.WORKERS_KEY
        self.calls.append("hset")
        self.hash[field] = value

    def hdel(self, key: str, *fields: str) -> None:
        self.calls.append("hdel")
        for name in fields:
            self.hash.pop(name, None)


def _heart(client: RecordingRedis, interval_s: float = 60) -> liveness.Heartbeat:
    return liveness.Heartbeat(client, "host:1", interval_s)  # type: ignore[arg-type]


def test_a_beat_after_leave_does_not_register_the_worker_again() -> None:
    client = RecordingRedis()
    heart = _heart(client)
    heart.beat()
    assert "host:1" in client.hash
    heart.leave()
    heart.beat()  # the beat thread's next turn, racing the shutdown
    assert client.hash == {}
    assert client.calls == ["hset", "hdel"]


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

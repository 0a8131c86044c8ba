"""Leader election: a restarted worker takes over from its dead predecessor at once."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from workers.leader import dead_here, run_as_leader, start


def test_a_process_of_this_host_that_exited_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert dead_here(f"{socket.gethostname()}:{child.pid}")


def test_a_live_process_or_another_host_is_never_taken_over() -> None:
    assert not dead_here(f"{socket.gethostname()}:{os.getpid()}")
    assert not dead_here(f"some-other-host:{2**22 + 7}")
    assert not dead_here("garbage")


class GrantingRedis:
    """Grants every lease request: the loop's timing, not Redis, is under test here."""

    def set(self, *args: object, **kwargs: object) -> bool:
        return True


def test_the_first_round_runs_at_once_not_after_an_interval() -> None:
    rounds: list[float] = []
    stop = threading.Event()
    stop.set()  # the loop returns after its first round instead of waiting an hour
    run_as_leader(GrantingRedis(), "lease", "me", 3600, lambda: rounds.append(1), stop)  # type: ignore[arg-type]
    assert rounds == [1]


def test_a_failing_round_does_not_end_the_loop() -> None:
    rounds: list[int] = []
    stop = threading.Event()

    def job() -> None:
        rounds.append(1)
        if len(rounds) == 3:
            stop.set()
        raise RuntimeError("OpenSearch is away")

    run_as_leader(GrantingRedis(), "lease", "me", 0.01, job, stop)  # type: ignore[arg-type]
    assert len(rounds) == 3


class RecordingLease(GrantingRedis):
    """Grants the lease and records the release, with whether a job round was still running then."""

    def __init__(self) -> None:
        self.running = threading.Event()
        self.released_while_running: list[bool] = []

    def eval(self, script: str, keys: int, key: str, me: str) -> int:
        self.released_while_running.append(self.running.is_set())
        return 1


def test_a_stopped_job_gives_its_lease_up_only_after_its_last_round() -> None:
    client = RecordingLease()

    def job() -> None:
        client.running.set()
        time.sleep(0.3)  # a reconcile round under way when the worker shuts down
        client.running.clear()

    periodic = start("test-job", client, "lease", "me", 0.01, job)  # type: ignore[arg-type]
    assert client.running.wait(5)
    periodic.stop(timeout_s=5)
    assert not periodic.thread.is_alive()
    assert client.released_while_running == [False]


class DownRedis:
    """A broker that refuses every call, as during an outage."""

    def set(self, *args: object, **kwargs: object) -> bool:
        raise ConnectionError("Redis is down")


def test_an_outage_logs_its_first_failure_not_every_round(caplog: pytest.LogCaptureFixture) -> None:
    stop = threading.Event()
    rounds = threading.Timer(0.5, stop.set)
    rounds.start()
    with caplog.at_level(logging.WARNING, logger="workers.leader"):
        run_as_leader(DownRedis(), "lease", "me", 0.01, lambda: None, stop)  # type: ignore[arg-type]
    failures = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failures) == 1  # about 50 rounds failed
    assert failures[0].exc_info is not None

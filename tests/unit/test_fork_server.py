"""The fork server: sandboxes are its children, with the sandbox's limits, and its loss is survived;
a resident server runs calls itself under the same limits, and is replaced when it breaks one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.errors import ErrorCode, PermanentError
from workers.fork_server import ForkServer

LIMITS: dict[str, Any] = {"timeout_s": 10.0, "memory_bytes": 1 << 30, "what": "parsing"}


def _nothing() -> None:
    """What the server loads before serving; the parsers, in a worker."""


def parent_and_self(label: str) -> dict[str, object]:
    return {"label": label, "ppid": os.getppid(), "pid": os.getpid()}


def allocate(gib: int) -> int:
    return len(bytearray(gib << 30))


def sleep(seconds: float) -> None:
    time.sleep(seconds)


def refuse() -> None:
    raise PermanentError("not a document", code=ErrorCode.UNSUPPORTED_MEDIA_TYPE)


@pytest.fixture
def server() -> Iterator[ForkServer]:
    server = ForkServer(_nothing)
    yield server
    server.close()


def test_each_call_runs_in_a_fresh_child_of_the_server(server: ForkServer) -> None:
    first = server.run(parent_and_self, ("a",), **LIMITS)
    second = server.run(parent_and_self, ("b",), **LIMITS)
    assert first["label"] == "a"
    assert second["label"] == "b"
    assert first["ppid"] == second["ppid"] == server.pid
    assert len({first["pid"], second["pid"], server.pid, os.getpid()}) == 4


def test_the_sandbox_limits_and_error_codes_hold(server: ForkServer) -> None:
    with pytest.raises(PermanentError) as memory:
        server.run(allocate, (8,), timeout_s=20, memory_bytes=256 << 20, what="parsing")
    assert memory.value.code == ErrorCode.PARSE_ERROR
    with pytest.raises(PermanentError) as slow:
        server.run(sleep, (60,), timeout_s=1, memory_bytes=1 << 30, what="parsing")
    assert slow.value.code == ErrorCode.TIMEOUT
    with pytest.raises(PermanentError) as refused:
        server.run(refuse, (), **LIMITS)
    assert refused.value.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert server.run(parent_and_self, ("after",), **LIMITS)["ppid"] == server.pid  # still serving


def test_a_dead_server_falls_back_to_forking_from_the_caller(server: ForkServer) -> None:
    os.kill(server.pid, 9)
    os.waitpid(server.pid, 0)
    result = server.run(parent_and_self, ("fallback",), **LIMITS)
    assert result["label"] == "fallback"
    assert result["ppid"] == os.getpid()


_KEPT: list[bytearray] = []


def keep(mib: int) -> int:
    _KEPT.append(bytearray(b"x" * (mib << 20)))  # written, so resident, not only mapped
    return os.getpid()


def die_where(pid: int) -> dict[str, object]:
    """Kills the process it runs in if that is `pid`; elsewhere reports where it ran."""
    if os.getpid() == pid:
        os.kill(pid, 9)
    return parent_and_self("survived")


@pytest.fixture
def resident() -> Iterator[ForkServer]:
    server = ForkServer(_nothing, resident=True)
    yield server
    server.close()


def test_a_resident_server_runs_each_call_itself(resident: ForkServer) -> None:
    first = resident.run(parent_and_self, ("a",), **LIMITS)
    second = resident.run(parent_and_self, ("b",), **LIMITS)
    assert first["pid"] == second["pid"] == resident.pid != os.getpid()
    assert second["label"] == "b"


def test_a_resident_server_keeps_the_limits_and_is_replaced_after_breaking_one(resident: ForkServer) -> None:
    with pytest.raises(PermanentError) as refused:
        resident.run(refuse, (), **LIMITS)
    assert refused.value.code == ErrorCode.UNSUPPORTED_MEDIA_TYPE
    assert resident.run(parent_and_self, ("same",), **LIMITS)["pid"] == resident.pid  # a refusal is no fault

    before = resident.pid
    with pytest.raises(PermanentError) as memory:
        resident.run(allocate, (8,), timeout_s=20, memory_bytes=256 << 20, what="parsing")
    assert memory.value.code == ErrorCode.PARSE_ERROR
    assert "memory" in memory.value.message
    after_memory = resident.run(parent_and_self, ("after memory",), **LIMITS)
    assert after_memory["pid"] == resident.pid != before  # a fresh server: the old heap is gone

    before = resident.pid
    started = time.monotonic()
    with pytest.raises(PermanentError) as slow:
        resident.run(sleep, (60,), timeout_s=1, memory_bytes=1 << 30, what="parsing")
    assert slow.value.code == ErrorCode.TIMEOUT
    assert time.monotonic() - started < 30  # the caller's own limit, not the sleep
    with pytest.raises(ProcessLookupError):
        os.kill(before, 0)  # killed and reaped
    assert resident.run(parent_and_self, ("after timeout",), **LIMITS)["pid"] == resident.pid != before


def test_a_resident_server_that_grew_leaves_for_a_fresh_one(resident: ForkServer) -> None:
    small = resident.run(keep, (1,), **LIMITS)
    assert resident.run(keep, (300,), **LIMITS) == small  # ran there, and then it left
    assert resident.run(parent_and_self, ("fresh",), **LIMITS)["pid"] not in (small, os.getpid())


def test_a_call_whose_resident_server_dies_is_decided_in_a_sandbox_of_its_own(resident: ForkServer) -> None:
    server = resident.pid
    result = resident.run(die_where, (server,), **LIMITS)
    assert result["label"] == "survived"
    assert result["ppid"] == os.getpid()  # a sandbox forked by the caller for this call
    assert resident.run(parent_and_self, ("next",), **LIMITS)["pid"] == resident.pid != server


class _Interrupted(BaseException):
    """What Celery's soft time limit is to a call: raised in the caller while it waits."""


def _interrupt(*_: object) -> None:
    raise _Interrupted


def test_a_caller_interrupted_mid_call_never_reads_that_reply_as_the_next_calls(resident: ForkServer) -> None:
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(_Interrupted):
            resident.run(slow_label, ("first", 1.0), **LIMITS)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    time.sleep(1.2)  # the first call's reply would be waiting by now
    assert resident.run(parent_and_self, ("second",), **LIMITS)["label"] == "second"


def slow_label(label: str, seconds: float) -> dict[str, object]:
    time.sleep(seconds)
    return parent_and_self(label)


def test_a_resident_server_dies_with_its_caller_even_mid_call() -> None:
    script = (
        "import sys, time\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from workers.fork_server import ForkServer\n"
        "from tests.unit.test_fork_server import LIMITS, _nothing, spin\n"
        "server = ForkServer(_nothing, resident=True)\n"
        "print(server.pid, flush=True)\n"
        "server.run(spin, (), **LIMITS)\n"
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", script, str(Path(__file__).resolve().parents[2])],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert caller.stdout is not None
    server = int(caller.stdout.readline())
    time.sleep(0.5)  # the server is spinning in the call now
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(server):
        time.sleep(0.05)
    assert not _alive(server)  # not left running the file under init


def spin() -> None:
    while True:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False

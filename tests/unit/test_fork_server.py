"""The fork server: sandboxes are its children, with the sandbox's limits, and its loss is survived."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
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

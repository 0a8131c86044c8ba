"""Run a function in a forked child with CPU-time, memory and wall-clock limits.

A hostile file (decompression bomb, billion laughs, pathological PDF) can then only kill the
child: the worker process survives and fails that one document with a clear code.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

from shared.errors import ErrorCode, PermanentError, RaglineError

# The most characters of an exception's message an operator's log gets (a parser's message can
# quote a few bytes of the file; never more than this).
CAUSE_CHARS = 200


class SandboxError(PermanentError):
    """A failure in the sandbox. `cause` is for the operator's log only: the exception's type,
    its message cut to CAUSE_CHARS, and the line of code that raised it; the user gets `message`."""

    def __init__(self, message: str, *, code: ErrorCode, cause: str | None = None) -> None:
        super().__init__(message, code=code)
        self.cause = cause


def describe(error: BaseException) -> str:
    """`module.Type: message (at file:line in function)`: what failed and where, for a log."""
    kind = type(error)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    message = str(error)
    if len(message) > CAUSE_CHARS:
        message = message[:CAUSE_CHARS] + "..."
    frames = traceback.extract_tb(error.__traceback__)
    where = f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{name}: {message!r}{where}"


def virtual_memory_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def limit_memory(limit: int | None, *, hard: bool) -> None:
    """Cap this process's address space at `limit` bytes (None: lift the cap to the hard limit);
    `hard`: for good (a sandbox about to run one parse), else only the soft limit, which a
    process that serves parses sets anew for each."""
    _set_soft(resource.RLIMIT_AS, limit, hard=hard)


def limit_cpu(seconds: int | None) -> None:
    """The soft CPU-time limit of this process (None: lifted to the hard limit); SIGXCPU past it."""
    _set_soft(resource.RLIMIT_CPU, seconds, hard=False)


def _set_soft(kind: int, limit: int | None, *, hard: bool) -> None:
    _, ceiling = resource.getrlimit(kind)
    if limit is None or (ceiling != resource.RLIM_INFINITY and limit > ceiling):
        limit = ceiling
    resource.setrlimit(kind, (limit, limit if hard else ceiling))


def timed_out(what: str, timeout_s: float) -> PermanentError:
    return PermanentError(f"{what} took longer than {timeout_s:.0f} s", code=ErrorCode.TIMEOUT)


def run_limited(fn: Callable[[], Any], *, timeout_s: float, memory_bytes: int, what: str) -> Any:
    """Return `fn()`'s JSON-serialisable result, computed in a child process under limits."""
    fd, result_path = tempfile.mkstemp(prefix="ragline-sandbox-", suffix=".json")
    os.close(fd)
    try:
        pid = os.fork()
        if pid == 0:  # child
            _child(fn, result_path, timeout_s, memory_bytes)
        return _wait(pid, result_path, timeout_s, what)
    finally:
        os.unlink(result_path)


def _child(fn: Callable[[], Any], result_path: str, timeout_s: float, memory_bytes: int) -> None:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        # The child already maps what the worker imported: the memory limit is on top of that.
        limit_memory(virtual_memory_bytes() + memory_bytes, hard=True)
        cpu = int(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        payload = outcome(fn)
        with open(result_path, "w", encoding="utf-8") as out:
            json.dump(payload, out)  # in pieces: a large result never needs its whole text at once
        code = 0
    finally:
        os._exit(code)


def outcome(fn: Callable[[], Any]) -> dict[str, Any]:
    """`fn()`'s result as {"ok": value}, or its failure as {"error": code, "message", "cause"}:
    what a sandbox reports, classified the same wherever the function ran."""
    try:
        payload: dict[str, Any] = {"ok": fn()}
    except RaglineError as error:
        payload = {"error": error.code.value, "message": error.message}
    except MemoryError as error:
        payload = {
            "error": ErrorCode.PARSE_ERROR.value,
            "message": "parsing needed more memory than allowed",
            "cause": describe(error),
        }
    except RecursionError as error:
        payload = {
            "error": ErrorCode.PARSE_ERROR.value,
            "message": "the document is nested too deeply",
            "cause": describe(error),
        }
    except Exception as error:  # noqa: BLE001  (any parser failure means an unreadable file)
        payload = {
            "error": ErrorCode.PARSE_ERROR.value,
            "message": f"could not parse the file ({type(error).__name__})",
            "cause": describe(error),
        }
    return payload


def _wait(pid: int, result_path: str, timeout_s: float, what: str) -> Any:
    # A pidfd becomes readable the moment the child exits: no polling interval is added to
    # every parse, where a poll would be a large share of a small document's parse stage.
    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)
    if not exited:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise timed_out(what, timeout_s)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        reason = "CPU time limit" if sig == signal.SIGXCPU else f"signal {sig}"
        raise PermanentError(f"{what} was stopped ({reason})", code=ErrorCode.PARSE_ERROR)
    try:
        with open(result_path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, ValueError):
        raise PermanentError(f"{what} ended without a result", code=ErrorCode.PARSE_ERROR) from None
    if "error" in payload:
        raise SandboxError(payload["message"], code=ErrorCode(payload["error"]), cause=payload.get("cause"))
    return payload["ok"]

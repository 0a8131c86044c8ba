"""Run a function in a forked child with CPU-time, memory and wall-clock limits.

A hostile file (decompression bomb, billion laughs, pathological PDF) can then only kill the
child: the worker process survives and fails that one document with a clear code. The child holds
none of its parent's descriptors (a parser exploited through a native library could otherwise
write to the worker's broker and database connections, or answer for another parse), can reach
neither the network nor another process (`workers.confinement`), dies with its parent, takes
what it started with it, and writes its result to a file without a name, which nothing can find
or leave behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from shared.errors import ErrorCode, PermanentError, RaglineError
from workers import confinement

_PR_SET_PDEATHSIG = 1
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


def limit_memory(limit: int, *, hard: bool) -> None:
    """Cap this process's address space at `limit` bytes; `hard`: for good (a sandbox about to run
    one parse), else only the soft limit, which a process that serves parses sets for each (see
    `limits_kept`)."""
    _set_soft(resource.RLIMIT_AS, limit, hard=hard)


def limit_cpu(seconds: int) -> None:
    """The soft CPU-time limit of this process; SIGXCPU past it."""
    _set_soft(resource.RLIMIT_CPU, seconds, hard=False)


def _set_soft(kind: int, limit: int, *, hard: bool) -> None:
    _, ceiling = resource.getrlimit(kind)
    if ceiling != resource.RLIM_INFINITY and limit > ceiling:
        limit = ceiling
    resource.setrlimit(kind, (limit, limit if hard else ceiling))


@contextlib.contextmanager
def limits_kept() -> Iterator[None]:
    """Limits set inside are undone on leaving: the memory and CPU limits the process had before
    (an operator's own soft limits among them) are its limits again."""
    kinds = (resource.RLIMIT_AS, resource.RLIMIT_CPU)
    before = [resource.getrlimit(kind) for kind in kinds]
    try:
        yield
    finally:
        for kind, value in zip(kinds, before, strict=True):
            resource.setrlimit(kind, value)


def release_inherited(keep: Iterable[int] = ()) -> None:
    """Point every descriptor this forked process inherited, but stdin, stdout, stderr and `keep`,
    at /dev/null.

    A fork copies all of the parent's descriptors: a pool process's connections to Redis,
    OpenSearch and the broker, and its end of each parse server's socket. dup2 over each number
    rather than close it: an object of the inherited heap that owns a number closes it when it is
    freed, and a number closed now could by then belong to a file this process opened since.
    """
    kept = {0, 1, 2, *keep}
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in kept and fd != null:
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed by now
                os.dup2(null, fd, inheritable=False)
    os.close(null)


def die_with_parent(parent: int) -> None:
    """Have the kernel kill this forked process when `parent` ends: a parse outlives neither its
    server nor its pool process, whatever file it is in the middle of. (The signal follows the
    thread that forked: pool processes and servers fork from their main thread.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent left before the request above took effect
        os._exit(0)


def timed_out(what: str, timeout_s: float) -> PermanentError:
    return PermanentError(f"{what} took longer than {timeout_s:.0f} s", code=ErrorCode.TIMEOUT)


def run_limited(
    fn: Callable[..., Any],
    *,
    timeout_s: float,
    memory_bytes: int,
    what: str,
    args: tuple[Any, ...] = (),
    private_input: bool = False,
) -> Any:
    """Return `fn(*args)`'s JSON-serialisable result, computed in a child process under limits.

    `private_input`: `args[0]` is the path of a file the child may read, alone of the worker's
    files (see `workers.confinement`).
    """
    parent = os.getpid()
    # The child's own directory (its temporary files, its home), removed whatever it left.
    private = confinement.private_directory("sandbox")
    try:
        # Unnamed (O_TMPFILE where the file system has it, else unlinked at once): the child writes
        # through its copy of the descriptor, the parent reads from the start once it has exited.
        with tempfile.TemporaryFile("w+", encoding="utf-8", prefix="ragline-sandbox-") as result:
            pid = os.fork()
            if pid == 0:  # child
                _child(
                    partial(fn, *args),
                    private_input,
                    private,
                    result.fileno(),
                    timeout_s,
                    memory_bytes,
                    parent,
                )
            return _wait(pid, result, timeout_s, memory_bytes, what)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _child(
    fn: partial[Any],
    private_input: bool,
    private: Path,
    result_fd: int,
    timeout_s: float,
    memory_bytes: int,
    parent: int,
) -> None:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        die_with_parent(parent)
        release_inherited(keep=[result_fd])
        # A group of its own: whatever it starts is killed with it (see `_wait`).
        os.setpgid(0, 0)
        # Its temporary files may hold as much as its memory: they are memory.
        confinement.confine(private, [Path(fn.args[0])] if private_input else [], memory_bytes)
        # The child already maps what the worker imported: the memory limit is on top of that.
        limit_memory(virtual_memory_bytes() + memory_bytes, hard=True)
        cpu = int(timeout_s) + 1
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        # No file it writes, its result among them, is larger than the memory it may use.
        resource.setrlimit(resource.RLIMIT_FSIZE, (memory_bytes, memory_bytes))
        payload = outcome(fn)
        _write_result(result_fd, payload)
        code = 0
    finally:
        os._exit(code)


def _write_result(result_fd: int, payload: dict[str, Any]) -> None:
    # Past RLIMIT_FSIZE a write fails (EFBIG) rather than the signal ending the process unheard.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        with os.fdopen(result_fd, "w", encoding="utf-8", closefd=False) as out:
            json.dump(payload, out)  # in pieces: a large result never needs its whole text at once
    except OSError:
        os.ftruncate(result_fd, 0)
        too_large = {"error": ErrorCode.TOO_LARGE.value, "message": "the parsed text is larger than allowed"}
        os.pwrite(result_fd, json.dumps(too_large).encode(), 0)


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


def _wait(pid: int, result: TextIO, timeout_s: float, memory_bytes: int, what: str) -> Any:
    # A pidfd becomes readable the moment the child exits: no polling interval is added to
    # every parse, where a poll would be a large share of a small document's parse stage.
    pidfd = os.pidfd_open(pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)
    # The child's group outlives it only through processes it started (a converter, or what a
    # hostile parser spawned): none may run on unlimited. The unreaped child keeps its number, so
    # the group cannot be another's yet.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    if not exited:  # it may not have made its group yet
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if not exited:
        raise timed_out(what, timeout_s)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        reason = "CPU time limit" if sig == signal.SIGXCPU else f"signal {sig}"
        raise PermanentError(f"{what} was stopped ({reason})", code=ErrorCode.PARSE_ERROR)
    if os.fstat(result.fileno()).st_size > memory_bytes:  # never read whole what could not be
        raise PermanentError(f"{what} gave a result larger than its memory", code=ErrorCode.TOO_LARGE)
    try:
        result.seek(0)
        payload = json.load(result)
    except (OSError, ValueError):
        raise PermanentError(f"{what} ended without a result", code=ErrorCode.PARSE_ERROR) from None
    return _payload(payload, what)


def _payload(payload: Any, what: str) -> Any:
    """The result a child wrote, or its failure; anything else it wrote is its failure too."""
    codes = {code.value for code in ErrorCode}
    if isinstance(payload, dict) and "ok" in payload:
        return payload["ok"]
    if (
        isinstance(payload, dict)
        and payload.get("error") in codes
        and isinstance(payload.get("message"), str)
        and isinstance(payload.get("cause"), str | None)
    ):
        raise SandboxError(payload["message"], code=ErrorCode(payload["error"]), cause=payload.get("cause"))
    raise PermanentError(f"{what} ended without a result", code=ErrorCode.PARSE_ERROR)

"""Small processes that parse apart from the pool process: a fork server, or a resident one.

A pool process holds the embedding and PII models, so its memory is large. A fork and the child's
exit cost in proportion to it (copying the page tables, then tearing them down): forking it for
every parse would cost more than the parse of a typical text document. The fork server is forked
from the pool process before the models load and holds only the parsers, like Android's zygote;
the sandboxes it forks run `workers.sandbox.run_limited` with the same limits as before. Should
the server die, parsing goes on through direct forks from the pool process, slower but the same.

A resident server (`resident=True`) runs each call itself instead, under the same memory limit
and wall-clock limit (and a CPU-time limit as a backstop): even a small server's fork and exit
cost several times what Ragline's own parsers take for a text document. It is for code without
native parts of its own, whose failures are Python exceptions: the caller kills it when a call
outlives its limit, it dies with the caller, it leaves after a call that ran out of memory, and
once it has grown by `RESIDENT_GROWTH_BYTES` it hands the next call to a fresh one, which the
caller starts. A call whose server died under it runs again in a sandbox of its own, with the
time it has left, which decides it as before.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import pickle
import resource
import signal
import socket
import struct
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from shared.errors import ErrorCode, RaglineError
from workers.sandbox import (
    SandboxError,
    limit_cpu,
    limit_memory,
    outcome,
    run_limited,
    timed_out,
    virtual_memory_bytes,
)

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
# Beyond the sandbox's own timeout: the server kills a late sandbox itself, so a reply later
# than this means the server is stuck.
_REPLY_GRACE_S = 30.0
# Growth of a resident server's memory (resident or mapped) after which a fresh one serves.
RESIDENT_GROWTH_BYTES = 256 << 20
_PR_SET_PDEATHSIG = 1


def _send(sock: socket.socket, value: Any) -> None:
    data = pickle.dumps(value)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def _receive(sock: socket.socket) -> Any:
    def exactly(count: int) -> bytes:
        parts, missing = [], count
        while missing:
            part = sock.recv(min(missing, 1 << 20))
            if not part:
                raise EOFError("the fork server's connection closed")
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    (length,) = _LENGTH.unpack(exactly(_LENGTH.size))
    return pickle.loads(exactly(length))  # noqa: S301  (our own process on a private socketpair)


def _reply(payload: dict[str, Any]) -> tuple[Any, ...]:
    if "ok" in payload:
        return ("ok", payload["ok"])
    return ("error", payload["error"], payload["message"], payload.get("cause"))


def _serve(sock: socket.socket, prepare: Callable[[], None], resident: bool) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if resident:
        _die_with_parent()
    prepare()
    # What this process holds now stays shared with its parent: the collector never touches it.
    gc.freeze()
    started_with = _resident_bytes(), virtual_memory_bytes()
    while True:
        try:
            fn, args, timeout_s, memory_bytes, what = _receive(sock)
        except (EOFError, OSError):
            return  # the pool process is gone
        leaving = False
        if resident:
            if _grown(started_with):
                # A fresh server takes this call: what a long-lived Python heap keeps stays bounded.
                _send(sock, (True, ("again",)))
                return
            payload = _run_resident(fn, args, timeout_s, memory_bytes)
            # A call that ran out of memory may have left the heap fragmented or half-freed.
            leaving = str(payload.get("cause", "")).startswith("MemoryError")
            reply = _reply(payload)
        else:
            try:
                reply = (
                    "ok",
                    run_limited(
                        partial(fn, *args), timeout_s=timeout_s, memory_bytes=memory_bytes, what=what
                    ),
                )
            except RaglineError as error:
                reply = ("error", error.code.value, error.message, getattr(error, "cause", None))
        try:
            _send(sock, (leaving, reply))
        except OSError:
            return  # the pool process left while its parse ran
        if leaving:
            return


def _run_resident(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float, memory_bytes: int
) -> dict[str, Any]:
    """One call under the sandbox's limits, set anew for it: memory on top of what the process
    maps now, CPU time (a backstop should the caller be gone: the caller's own clock kills the
    server first) on top of what it has used. The reply is not the call's to pay for."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    limit_cpu(int(used.ru_utime + used.ru_stime + timeout_s) + 1)
    limit_memory(virtual_memory_bytes() + memory_bytes, hard=False)
    try:
        return outcome(partial(fn, *args))
    finally:
        limit_memory(None, hard=False)
        limit_cpu(None)


def _grown(started_with: tuple[int, int]) -> bool:
    resident, virtual = started_with
    return (
        _resident_bytes() - resident > RESIDENT_GROWTH_BYTES
        or virtual_memory_bytes() - virtual > RESIDENT_GROWTH_BYTES
    )


def _die_with_parent() -> None:
    """A resident server outlives no pool process: it could be mid-way through a hostile file.
    (The signal follows the forking thread: a pool process forks from its main thread.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent left before the request above took effect
        os._exit(0)


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ForkServer:
    """`ForkServer(prepare)` in a pool process, before it loads anything large."""

    def __init__(self, prepare: Callable[[], None], *, resident: bool = False) -> None:
        self._prepare, self.resident = prepare, resident
        self._sock: socket.socket | None = None
        self.pid = 0
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ours.close()
                _serve(theirs, self._prepare, self.resident)
            except BaseException:
                log.exception("the fork server failed")
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self._sock, self.pid = ours, pid

    def run(
        self, fn: Callable[..., Any], args: tuple[Any, ...], *, timeout_s: float, memory_bytes: int, what: str
    ) -> Any:
        """`run_limited(fn(*args))` through the server; `fn` and `args` must pickle."""
        started = time.monotonic()
        for _ in range(2):  # a resident server that has grown hands the call to a fresh one
            if self._sock is None and self.resident:
                self._start()  # the last one left, was killed or died
            if self._sock is None:
                break
            try:
                self._sock.settimeout(timeout_s if self.resident else timeout_s + _REPLY_GRACE_S)
                _send(self._sock, (fn, args, timeout_s, memory_bytes, what))
                leaving, reply = _receive(self._sock)
            except (EOFError, OSError, pickle.PickleError) as error:
                self.close()
                if self.resident and isinstance(error, TimeoutError):
                    raise timed_out(what, timeout_s) from None  # killed: the next call starts another
                log.warning(
                    "the fork server stopped answering (%s); this parse forks a sandbox directly", error
                )
                break
            except BaseException:
                self.close()  # a reply still on its way must never be read as the next call's
                raise
            if leaving:
                self.close()
            if reply[0] == "again":
                continue
            if reply[0] == "ok":
                return reply[1]
            raise SandboxError(reply[2], code=ErrorCode(reply[1]), cause=reply[3])
        # A resident server that died under the call leaves it the rest of its time, not more.
        left = timeout_s - (time.monotonic() - started) if self.resident else timeout_s
        if left <= 0:
            raise timed_out(what, timeout_s)
        return run_limited(partial(fn, *args), timeout_s=left, memory_bytes=memory_bytes, what=what)

    def close(self) -> None:
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

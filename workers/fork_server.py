"""Small processes that parse apart from the pool process: a fork server, or a resident one.

A pool process holds the embedding and PII models, so its memory is large. A fork and the child's
exit cost in proportion to it (copying the page tables, then tearing them down): forking it for
every parse would cost more than the parse of a typical text document. The fork server is forked
from the pool process before the models load and holds only the parsers, like Android's zygote;
the sandboxes it forks run `workers.sandbox.run_limited` with the same limits as before. Should
the server die, parsing goes on through direct forks from the pool process, slower but the same.

A resident server (`resident=True`) runs each call itself instead, under the same memory limit
and wall-clock limit: even a small server's fork and exit cost several times what Ragline's own
parsers take for a text document. It is for code without native parts of its own, whose failures
are Python exceptions: the caller kills it when a call outlives its limit, it leaves after a call
that ran out of memory or grew by `RESIDENT_GROWTH_BYTES`, and the caller starts another for the
next call. A call whose server died under it runs again in a sandbox of its own, which decides
it as before.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable
from functools import partial
from typing import Any

from shared.errors import ErrorCode, RaglineError
from workers.sandbox import SandboxError, limit_memory, outcome, run_limited, timed_out, virtual_memory_bytes

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
# Beyond the sandbox's own timeout: the server kills a late sandbox itself, so a reply later
# than this means the server is stuck.
_REPLY_GRACE_S = 30.0
# Growth of a resident server's resident memory after which it leaves for a fresh one.
RESIDENT_GROWTH_BYTES = 256 << 20


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
    prepare()
    base = virtual_memory_bytes()  # a resident call's memory limit is on top of what it holds now
    resident_from = _resident_bytes()
    while True:
        try:
            fn, args, timeout_s, memory_bytes, what = _receive(sock)
        except (EOFError, OSError):
            return  # the pool process is gone
        leaving = False
        if resident:
            limit_memory(base + memory_bytes, hard=False)
            payload = outcome(partial(fn, *args))
            # After a call that ran out of memory or left the heap much larger, a fresh server
            # serves the next: what a long-lived Python heap keeps stays bounded.
            out_of_memory = str(payload.get("cause", "")).startswith("MemoryError")
            leaving = out_of_memory or _resident_bytes() - resident_from > RESIDENT_GROWTH_BYTES
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
        if self._sock is None and self.resident:
            self._start()  # the last one left, was killed or died
        if self._sock is not None:
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
            else:
                if leaving:
                    self.close()
                if reply[0] == "ok":
                    return reply[1]
                raise SandboxError(reply[2], code=ErrorCode(reply[1]), cause=reply[3])
        return run_limited(partial(fn, *args), timeout_s=timeout_s, memory_bytes=memory_bytes, what=what)

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

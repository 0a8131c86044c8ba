"""A small process that forks the parse sandboxes, so that each fork is cheap.

A pool process holds the embedding and PII models, so its memory is large. A fork and the child's
exit cost in proportion to it (copying the page tables, then tearing them down): forking it for
every parse would cost more than the parse of a typical text document. The fork server is forked
from the pool process before the models load and holds only the parsers, like Android's zygote;
the sandboxes it forks run `workers.sandbox.run_limited` with the same limits as before. Should
the server die, parsing goes on through direct forks from the pool process, slower but the same.
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
from workers.sandbox import SandboxError, run_limited

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
# Beyond the sandbox's own timeout: the server kills a late sandbox itself, so a reply later
# than this means the server is stuck.
_REPLY_GRACE_S = 30.0


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


def _serve(sock: socket.socket, prepare: Callable[[], None]) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    prepare()
    while True:
        try:
            fn, args, timeout_s, memory_bytes, what = _receive(sock)
        except (EOFError, OSError):
            return  # the pool process is gone
        try:
            reply: tuple[Any, ...] = (
                "ok",
                run_limited(partial(fn, *args), timeout_s=timeout_s, memory_bytes=memory_bytes, what=what),
            )
        except RaglineError as error:
            reply = ("error", error.code.value, error.message, getattr(error, "cause", None))
        try:
            _send(sock, reply)
        except OSError:
            return  # the pool process left while its parse ran


class ForkServer:
    """`ForkServer(prepare)` in a pool process, before it loads anything large."""

    def __init__(self, prepare: Callable[[], None]) -> None:
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                ours.close()
                _serve(theirs, prepare)
            except BaseException:
                log.exception("the fork server failed")
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self._sock: socket.socket | None = ours
        self.pid = pid

    def run(
        self, fn: Callable[..., Any], args: tuple[Any, ...], *, timeout_s: float, memory_bytes: int, what: str
    ) -> Any:
        """`run_limited(fn(*args))` through the server; `fn` and `args` must pickle."""
        if self._sock is not None:
            try:
                self._sock.settimeout(timeout_s + _REPLY_GRACE_S)
                _send(self._sock, (fn, args, timeout_s, memory_bytes, what))
                reply = _receive(self._sock)
            except (EOFError, OSError, pickle.PickleError) as error:
                log.warning("the fork server stopped answering (%s); forking sandboxes directly", error)
                self.close()
            else:
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

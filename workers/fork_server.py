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

Neither kind of server, nor any sandbox, holds the pool process's descriptors (its broker and
database connections, its end of the other server's socket), or can reach the network or another
process (`workers.confinement`), and each dies with its parent.
Replies are JSON and carry the number of the call they answer: the pool process never unpickles
what a parsing process sent, and a reply out of turn retires the server.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import logging
import os
import pickle
import resource
import shutil
import signal
import socket
import struct
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from shared.config import PARSE_REPLY_GRACE_S, get_settings
from shared.errors import ErrorCode, RaglineError
from workers import confinement
from workers.sandbox import (
    SandboxError,
    describe,
    die_with_parent,
    limit_cpu,
    limit_memory,
    limits_kept,
    outcome,
    release_inherited,
    run_limited,
    timed_out,
    virtual_memory_bytes,
)

log = logging.getLogger(__name__)

_LENGTH = struct.Struct("!Q")
# Growth of a resident server's memory (resident or mapped) after which a fresh one serves.
RESIDENT_GROWTH_BYTES = 256 << 20


class OutOfTurn(ValueError):
    """A reply that is not the answer to the call just sent."""


def _frame(data: bytes) -> bytes:
    return _LENGTH.pack(len(data)) + data


def _read_frame(sock: socket.socket, deadline: float | None = None, most: int | None = None) -> bytes:
    """One frame; by `deadline` (monotonic) as a whole, not a timeout for each piece, which a
    sender could keep alive a byte at a time; of `most` bytes at most (ValueError past it)."""

    def exactly(count: int) -> bytes:
        parts, missing = [], count
        while missing:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError("the reply did not arrive in time")
                sock.settimeout(left)
            part = sock.recv(min(missing, 1 << 20))
            if not part:
                raise EOFError("the fork server's connection closed")
            parts.append(part)
            missing -= len(part)
        return b"".join(parts)

    (length,) = _LENGTH.unpack(exactly(_LENGTH.size))
    if most is not None and length > most:
        raise ValueError(f"a frame of {length} bytes, over {most}")
    return exactly(length)


# Calls go to the server pickled (the function and its arguments); replies come back as JSON,
# which carries data only: the pool process never unpickles what a parsing process sent.


def _send_call(sock: socket.socket, call: tuple[Any, ...]) -> None:
    sock.sendall(_frame(pickle.dumps(call)))


def _receive_call(sock: socket.socket) -> tuple[Any, ...]:
    call: tuple[Any, ...] = pickle.loads(_read_frame(sock))  # noqa: S301  (from the pool process)
    return call


def _send_reply(sock: socket.socket, call: int, leaving: bool, reply: list[Any]) -> None:
    sock.sendall(_frame(json.dumps({"call": call, "leaving": leaving, "reply": reply}).encode()))


def _receive_reply(
    sock: socket.socket, call: int, deadline: float | None = None, most: int | None = None
) -> tuple[bool, list[Any]]:
    """The reply to `call` (by `deadline`, of `most` bytes at most); OutOfTurn for anything else,
    whatever its shape, so that the caller retires the server instead of failing on a reply it
    cannot read."""
    answer = json.loads(_read_frame(sock, deadline, most))
    if not isinstance(answer, dict) or answer.get("call") != call:
        raise OutOfTurn(f"a reply to call {answer.get('call') if isinstance(answer, dict) else '?'}")
    reply = answer.get("reply")
    codes = {code.value for code in ErrorCode}
    if not (
        isinstance(reply, list)
        and (
            (len(reply) == 2 and reply[0] == "ok")
            or reply == ["again"]
            or (len(reply) == 4 and reply[0] == "error" and reply[1] in codes and isinstance(reply[2], str))
        )
    ):
        raise OutOfTurn(f"a reply to call {call} that is not one")
    return bool(answer.get("leaving")), reply


def _result(reply: list[Any]) -> Any:
    """The call's result, or its failure raised as a sandbox's would be."""
    if reply[0] == "ok":
        return reply[1]
    raise SandboxError(reply[2], code=ErrorCode(reply[1]), cause=reply[3])


def _reply(payload: dict[str, Any]) -> list[Any]:
    if "ok" in payload:
        return ["ok", payload["ok"]]
    return ["error", payload["error"], payload["message"], payload.get("cause")]


def _serve(
    sock: socket.socket,
    prepare: Callable[[], None],
    resident: bool,
    parent: int,
    dirs: tuple[Path, Path],
    scratch_bytes: int,
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    die_with_parent(parent)
    # The pool process's connections, and its end of a server forked before this one: not ours.
    release_inherited(keep=[sock.fileno()])
    os.setpgid(0, 0)  # what it starts is killed with it (see `close`)
    private, inbox = dirs
    # Its sandboxes' directories in its own, which its caller removes whatever way it ends.
    tempfile.tempdir = str(private)
    if resident:
        # It parses: confined as a sandbox is, its inputs copied in through the inbox, read-only.
        # (The full server only forks the sandboxes, which confine themselves, each to its input.)
        confinement.confine(private, [inbox], scratch_bytes)
    prepare()
    # What this process holds now stays shared with its parent: the collector never touches it.
    gc.freeze()
    started_with = _resident_bytes(), virtual_memory_bytes()
    held_at_start = _held()
    while True:
        try:
            call, fn, args, timeout_s, memory_bytes, what, private_input = _receive_call(sock)
        except (EOFError, OSError):
            return  # the pool process is gone
        leaving = False
        if resident:
            if _grown(started_with):
                # A fresh server takes this call: what a long-lived Python heap keeps stays bounded.
                _send_reply(sock, call, True, ["again"])
                return
            payload = _run_resident(fn, args, timeout_s, memory_bytes)
            # A call that ran out of memory may have left the heap fragmented or half-freed; one
            # that left something running (a thread, a child) or shared memory behind would
            # carry it into the next document's call.
            leaving = str(payload.get("cause", "")).startswith("MemoryError") or _left_behind(
                held_at_start, private
            )
            reply = _reply(payload)
        else:
            try:
                reply = [
                    "ok",
                    run_limited(
                        fn,
                        args=args,
                        private_input=private_input,
                        timeout_s=timeout_s,
                        memory_bytes=memory_bytes,
                        what=what,
                    ),
                ]
            except RaglineError as error:
                reply = ["error", error.code.value, error.message, getattr(error, "cause", None)]
            except Exception as error:  # noqa: BLE001  (the server outlives whatever a sandbox did)
                reply = ["error", ErrorCode.PARSE_ERROR.value, "could not parse the file", describe(error)]
        try:
            _send_reply(sock, call, leaving, reply)
        except OSError:
            return  # the pool process left while its parse ran
        if leaving:
            return
        if resident:
            del reply, payload
            # A parser's reference cycles would otherwise keep a document's text until the next
            # full collection, which a frozen heap rarely triggers; the caller is busy meanwhile.
            gc.collect()


def _run_resident(
    fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float, memory_bytes: int
) -> dict[str, Any]:
    """One call under the sandbox's limits, set anew for it: memory on top of what the process
    maps now, CPU time (a backstop should the caller be gone: the caller's own clock kills the
    server first) on top of what it has used. The reply is not the call's to pay for."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    with limits_kept():
        limit_cpu(int(used.ru_utime + used.ru_stime + timeout_s) + 1)
        limit_memory(virtual_memory_bytes() + memory_bytes, hard=False)
        return outcome(partial(fn, *args))


def _left_behind(held_at_start: tuple[int, int], private: Path) -> bool:
    """Whether this process runs a thread or a child besides itself, holds more descriptors (a
    memfd among them) or mapped shared memory than when it started serving, or left a file in
    its directory (which would fill its scratch for the documents after)."""
    threads = os.listdir("/proc/self/task")
    if len(threads) > 1 or any(private.iterdir()):
        return True
    try:
        with open(f"/proc/self/task/{threads[0]}/children", encoding="ascii") as children:
            if children.read().strip():
                return True
    except FileNotFoundError:  # a kernel without CONFIG_PROC_CHILDREN: the group kill still holds
        pass
    descriptors, shared = _held()
    return descriptors > held_at_start[0] or shared > held_at_start[1]


def _held() -> tuple[int, int]:
    """Open descriptors, and mapped shared memory in bytes."""
    shared = 0
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("RssShmem:"):
                shared = int(line.split()[1]) * 1024
    return len(os.listdir("/proc/self/fd")), shared


def _grown(started_with: tuple[int, int]) -> bool:
    resident, virtual = started_with
    return (
        _resident_bytes() - resident > RESIDENT_GROWTH_BYTES
        or virtual_memory_bytes() - virtual > RESIDENT_GROWTH_BYTES
    )


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class ForkServer:
    """`ForkServer(prepare)` in a pool process, before it loads anything large."""

    def __init__(
        self, prepare: Callable[[], None], *, resident: bool = False, scratch_bytes: int | None = None
    ) -> None:
        self._prepare, self.resident = prepare, resident
        # A resident server's temporary files, as a sandbox's, may hold as much as a parse's memory.
        self._scratch_bytes = get_settings().parse.memory_mb << 20 if scratch_bytes is None else scratch_bytes
        self._sock: socket.socket | None = None
        self.pid = 0
        # Its own directory (temporary files), and, for a resident one, the inbox its inputs'
        # copies come through, which it may read and not write.
        self._dirs: tuple[Path, Path] | None = None
        self._calls = itertools.count()
        self._start()

    def _start(self) -> None:
        ours, theirs = socket.socketpair()
        parent = os.getpid()
        private, inbox = confinement.private_directory("parse"), confinement.private_directory("inbox")
        try:
            pid = os.fork()
        except OSError:
            for directory in (private, inbox):
                shutil.rmtree(directory, ignore_errors=True)
            raise
        if pid == 0:
            code = 0
            try:
                ours.close()
                _serve(theirs, self._prepare, self.resident, parent, (private, inbox), self._scratch_bytes)
            except BaseException:
                log.exception("the fork server failed")
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        self._sock, self.pid, self._dirs = ours, pid, (private, inbox)

    def run(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        timeout_s: float,
        memory_bytes: int,
        what: str,
        private_input: bool = False,
    ) -> Any:
        """`run_limited(fn(*args))` through the server; `fn` and `args` must pickle.

        `private_input`: `args[0]` is a file the parse may read, through a copy of its own."""
        started = time.monotonic()
        for _ in range(2):  # a resident server that has grown hands the call to a fresh one
            if self._sock is None and self.resident:
                try:
                    self._start()  # the last one left, was killed or died
                except OSError as error:  # no fork now (memory, process limit): a sandbox may fit
                    log.warning("could not start a parse server (%s); this parse forks a sandbox", error)
            if self._sock is None:
                break
            call = next(self._calls)
            handed = None
            try:
                handed = self._hand_over(args, private_input)
                wait = timeout_s if self.resident else timeout_s + PARSE_REPLY_GRACE_S
                self._sock.settimeout(wait)
                sent = args if handed is None else (handed, *args[1:])
                _send_call(self._sock, (call, fn, sent, timeout_s, memory_bytes, what, private_input))
                # No reply is larger than the memory the call may use.
                leaving, reply = _receive_reply(self._sock, call, time.monotonic() + wait, memory_bytes)
            except (EOFError, OSError, ValueError) as error:  # ValueError: not JSON, or OutOfTurn
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
            finally:
                if handed is not None:
                    handed.unlink(missing_ok=True)
            if leaving:
                self.close()
            if reply[0] != "again":
                return _result(reply)
        # A server that died under the call leaves it the rest of its time, not more.
        left = timeout_s - (time.monotonic() - started)
        if left <= 0:
            raise timed_out(what, timeout_s)
        return run_limited(
            fn, args=args, private_input=private_input, timeout_s=left, memory_bytes=memory_bytes, what=what
        )

    def _hand_over(self, args: tuple[Any, ...], private_input: bool) -> Path | None:
        """A resident server's copy of the input, through its inbox; None for the full server,
        whose sandboxes each get a Landlock rule for the file itself."""
        if not (private_input and self.resident and self._dirs is not None):
            return None
        return confinement.hand_over(Path(args[0]), self._dirs[1])

    def close(self) -> None:
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # unreaped, its number is no one else's group
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        for directory in self._dirs or ():  # once nothing of the server is left to write there
            shutil.rmtree(directory, ignore_errors=True)
        self._dirs = None

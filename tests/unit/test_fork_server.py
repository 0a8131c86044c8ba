"""The fork server: sandboxes are its children, with the sandbox's limits, and its loss is survived;
a resident server runs calls itself under the same limits, and is replaced when it breaks one."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared.errors import ErrorCode, PermanentError
from workers.fork_server import ForkServer, OutOfTurn, _frame, _receive_reply, _run_resident, _send_reply
from workers.sandbox import run_limited

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


def descriptors() -> dict[int, str]:
    """What each descriptor beyond stdin, stdout and stderr of the process it runs in points to."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return {fd: target for fd, target in found.items() if fd > 2}


def _inode(sock: socket.socket) -> str:
    return f"socket:[{os.fstat(sock.fileno()).st_ino}]"


def test_no_parse_process_holds_the_callers_connections_or_files(tmp_path: Path) -> None:
    """A parser a hostile file took over could otherwise write to the pool process's broker and
    database connections, or forge another parse's reply on a server's socket."""
    secret = (tmp_path / "secret").open("w")
    ours, theirs = socket.socketpair()
    lean = ForkServer(_nothing, resident=True)
    full = ForkServer(_nothing)  # forked after the lean one: it was born holding the lean socket
    try:
        callers = {_inode(ours), _inode(theirs), *(_inode(s._sock) for s in (lean, full) if s._sock)}
        in_sandbox = full.run(descriptors, (), **LIMITS)
        in_resident = lean.run(descriptors, (), **LIMITS)
        in_direct = run_limited(descriptors, **LIMITS)
        for held in (in_sandbox, in_resident, in_direct):
            assert str(tmp_path / "secret") not in held.values()
            assert not callers & set(held.values())
        # A sandbox holds no socket at all, nor a pipe; the resident server only its own socket.
        for held in (in_sandbox, in_direct):
            assert not [t for t in held.values() if t.startswith(("socket:", "pipe:"))]
        assert len([t for t in in_resident.values() if t.startswith("socket:")]) == 1
    finally:
        lean.close()
        full.close()
        ours.close()
        theirs.close()
        secret.close()


_RAN: list[str] = []


class _Exploit:
    def __reduce__(self) -> tuple[Any, ...]:
        return (_RAN.append, ("unpickled",))


def test_a_reply_is_read_as_data_and_never_unpickled() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(_frame(pickle.dumps({"call": 0, "leaving": False, "reply": ["ok", _Exploit()]})))
        with pytest.raises(UnicodeDecodeError):  # a pickle is not even text
            _receive_reply(ours, 0)
    assert _RAN == []


def answer_out_of_turn() -> str:
    """Writes a reply to another call on every socket it holds; in a resident server, its own."""
    for target in descriptors().values():
        if target.startswith("socket:"):
            for fd, name in descriptors().items():
                if name == target:
                    with socket.socket(fileno=os.dup(fd)) as sock:
                        _send_reply(sock, 10**6, False, ["ok", "forged"])
    return "genuine"


def test_a_reply_out_of_turn_retires_the_server_and_its_call_runs_in_a_sandbox(resident: ForkServer) -> None:
    server = resident.pid
    assert resident.run(answer_out_of_turn, (), **LIMITS) == "genuine"
    assert resident.run(parent_and_self, ("next",), **LIMITS)["pid"] == resident.pid != server


def _first_child_of(parent: int) -> list[int]:
    """The pid of the first child `parent` forks, within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        for name in os.listdir("/proc"):
            if name.isdigit():
                with contextlib.suppress(OSError), open(f"/proc/{name}/stat", encoding="ascii") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == parent:
                        return [int(name)]
        time.sleep(0.01)
    return []


def test_a_sandbox_dies_with_its_server_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupted caller kills the full server; its sandbox, mid-way through a document, goes
    with it, and the file its result was to be written to has no name to be found under."""
    results = tmp_path / "tmp"
    results.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(results))
    full = ForkServer(_nothing)
    found: list[int] = []
    watcher = threading.Thread(target=lambda: found.extend(_first_child_of(full.pid)), daemon=True)
    watcher.start()
    previous = signal.signal(signal.SIGALRM, _interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(_Interrupted):
            full.run(sleep, (60,), **LIMITS)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        full.close()
    watcher.join()
    (sandbox,) = found
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(sandbox):
        time.sleep(0.05)
    assert not _alive(sandbox)
    assert list(results.iterdir()) == []


def test_a_resident_call_gives_back_the_limits_the_process_had() -> None:
    """An operator's own soft limits hold again after each call, not the hard limits."""
    kinds = (resource.RLIMIT_AS, resource.RLIMIT_CPU)
    before = [resource.getrlimit(kind) for kind in kinds]
    own = [(64 << 40 if hard == resource.RLIM_INFINITY else hard, hard) for _, hard in before]
    try:
        for kind, value in zip(kinds, own, strict=True):
            resource.setrlimit(kind, value)
        assert _run_resident(len, ("abc",), 10.0, 1 << 30) == {"ok": 3}
        assert [resource.getrlimit(kind) for kind in kinds] == own
    finally:
        for kind, value in zip(kinds, before, strict=True):
            resource.setrlimit(kind, value)


@pytest.mark.parametrize(
    "answer",
    [
        {"call": 0},
        {"call": 0, "leaving": False, "reply": 1},
        {"call": 0, "leaving": False, "reply": []},
        {"call": 0, "leaving": False, "reply": ["error", "NOPE", "m", None]},
        [0],
    ],
)
def test_a_reply_of_any_other_shape_is_out_of_turn(answer: object) -> None:
    """Refused as one kind of error, which retires the server; a KeyError, TypeError or IndexError
    escaped the caller's handling and failed the document."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(_frame(json.dumps(answer).encode()))
        with pytest.raises(OutOfTurn):
            _receive_reply(ours, 0)


def test_a_call_whose_fork_server_dies_is_decided_in_the_time_it_has_left(server: ForkServer) -> None:
    """The fallback sandbox gets what is left of the call's limit, not the limit again: a parse
    must stay within the stage's own time limit."""
    killer = threading.Timer(1.5, os.kill, (server.pid, signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(PermanentError) as caught:
            server.run(sleep, (2.0,), **{**LIMITS, "timeout_s": 3.0})
    finally:
        killer.join()
    assert caught.value.code == ErrorCode.TIMEOUT


def test_a_reply_has_one_deadline_and_a_size_bound() -> None:
    """A sender cannot hold the caller by dripping its reply, nor make it buffer without end."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        frame = _frame(json.dumps({"call": 0, "leaving": False, "reply": ["ok", "x" * 64]}).encode())

        def drip() -> None:
            with contextlib.suppress(OSError):
                for byte in frame:
                    theirs.send(bytes([byte]))
                    time.sleep(0.1)

        threading.Thread(target=drip, daemon=True).start()
        ours.settimeout(0.5)  # each piece arrives well within this
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            _receive_reply(ours, 0, time.monotonic() + 1.0)
        assert time.monotonic() - started < 3
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(_frame(b"[" * 4096))
        with pytest.raises(ValueError, match="over 1024"):
            _receive_reply(ours, 0, time.monotonic() + 5, most=1024)


def leave_behind(what: str) -> int:
    """A call that leaves something running, or shared memory held, for the next document's call."""
    if what == "thread":
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
    elif what == "child":
        subprocess.Popen(["sleep", "60"])
    elif what == "shared memory":
        shared = os.memfd_create("kept")
        os.write(shared, b"x" * (4 << 20))
    return os.getpid()


@pytest.mark.parametrize("what", ["thread", "child", "shared memory"])
def test_a_resident_server_that_a_call_left_something_in_is_replaced(resident: ForkServer, what: str) -> None:
    first = resident.run(leave_behind, (what,), **LIMITS)
    second = resident.run(leave_behind, ("nothing",), **LIMITS)
    assert first != second  # the next call ran in a fresh server
    assert resident.run(leave_behind, ("nothing",), **LIMITS) == second  # which stays

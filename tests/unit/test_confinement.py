"""A parse process taken over by a hostile file reaches neither the pool process (its descriptors,
environment, signals), nor the network, and what it starts dies with it."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from workers import confinement
from workers.fork_server import ForkServer
from workers.sandbox import run_limited

F_SETSIG = 10  # Linux: the signal an O_ASYNC descriptor sends its owner
LIMITS: dict[str, Any] = {"timeout_s": 10.0, "memory_bytes": 1 << 30, "what": "parsing"}


def _nothing() -> None:
    """What a server loads before serving."""


def _attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as error:
        return f"refused ({error.strerror})"
    return "done"


def reach(pool: int, pipe: int, port: int, files: str, urgent: int = 0) -> dict[str, str]:
    """What a hostile parser would try against the pool process `pool`, which holds the write end
    `pipe` of a pipe and listens on loopback `port`, and against the worker's `files`: a blob
    (0600) and its code. None of the attempts changes anything where it succeeds. `urgent`: the
    signal sent to the group and to every process (SIGURG, ignored unless handled, where a
    confined process sends it; 0, which only asks, where an unconfined one would reach all)."""

    def connect() -> None:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()

    def connect_unix() -> None:  # a service's socket (Redis's, a container daemon's)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(2)
            client.connect(f"{files}/service.sock")

    def sigio() -> None:
        read, write = os.pipe()
        fcntl.fcntl(read, fcntl.F_SETOWN, pool)
        fcntl.fcntl(read, F_SETSIG, signal.SIGURG)
        fcntl.fcntl(read, fcntl.F_SETFL, os.O_ASYNC | os.O_NONBLOCK)
        os.write(write, b"x")

    def opened(path: str, flags: int) -> Callable[[], None]:
        return lambda: os.close(os.open(path, flags))

    return {
        "read a blob": _attempt(opened(f"{files}/blob", os.O_RDONLY)),
        "open its code to write": _attempt(opened(f"{files}/code.py", os.O_WRONLY | os.O_APPEND)),
        "open a kernel setting to write": _attempt(opened("/proc/sys/kernel/core_pattern", os.O_WRONLY)),
        "make a file outside": _attempt(opened(f"{files}/new", os.O_WRONLY | os.O_CREAT)),
        "signal it through SIGIO": _attempt(sigio),
        "read its limits": _attempt(lambda: resource.prlimit(pool, resource.RLIMIT_CORE)),
        "renice it (to its own value)": _attempt(
            lambda: os.setpriority(os.PRIO_PROCESS, pool, os.getpriority(os.PRIO_PROCESS, pool))
        ),
        "pin it (to its own cores)": _attempt(lambda: os.sched_setaffinity(pool, os.sched_getaffinity(pool))),
        "reopen its pipe": _attempt(lambda: os.close(os.open(f"/proc/{pool}/fd/{pipe}", os.O_WRONLY))),
        "read its environment": _attempt(lambda: open(f"/proc/{pool}/environ", "rb").close()),
        "read its memory": _attempt(lambda: open(f"/proc/{pool}/mem", "rb").close()),
        "signal it": _attempt(lambda: os.kill(pool, 0)),
        "signal the whole group": _attempt(lambda: os.kill(0, urgent)),
        "signal everyone": _attempt(lambda: os.kill(-1, urgent)),
        "connect to loopback": _attempt(connect),
        "connect to a Unix socket in the file system": _attempt(connect_unix),
    }


_URGENT: list[int] = []


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[tuple[int, int, int, str]]:
    read, write = os.pipe()
    listener = socket.create_server(("127.0.0.1", 0))
    service = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    service.bind(str(tmp_path / "service.sock"))
    service.listen()
    (tmp_path / "blob").write_bytes(b"a tenant's document")
    (tmp_path / "blob").chmod(0o600)
    (tmp_path / "code.py").write_text("WORKER = True\n")
    _URGENT.clear()
    previous = signal.signal(signal.SIGURG, lambda *_: _URGENT.append(1))
    try:
        yield os.getpid(), write, listener.getsockname()[1], str(tmp_path)
    finally:
        signal.signal(signal.SIGURG, previous)
        listener.close()
        service.close()
        os.close(read)
        os.close(write)


def test_the_pool_process_itself_can_do_all_of_it(pool: tuple[int, int, int, str]) -> None:
    """The attempts are real: unconfined, each one succeeds."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if set(reach(*pool).values()) == {"done"} else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    _delivered(expected=True)


def _delivered(*, expected: bool) -> None:
    deadline = time.monotonic() + (2 if expected else 0.5)
    while time.monotonic() < deadline and not _URGENT:
        time.sleep(0.01)
    assert bool(_URGENT) == expected


def test_no_parse_process_reaches_the_pool_process_or_the_network(pool: tuple[int, int, int, str]) -> None:
    lean = ForkServer(_nothing, resident=True)
    full = ForkServer(_nothing)
    try:
        tried = {
            "resident server": lean.run(reach, (*pool, signal.SIGURG), **LIMITS),
            "fork server's sandbox": full.run(reach, (*pool, signal.SIGURG), **LIMITS),
            "direct sandbox": run_limited(lambda: reach(*pool, signal.SIGURG), **LIMITS),
        }
    finally:
        lean.close()
        full.close()
    for where, outcome in tried.items():
        # These calls may succeed: the signals reach no process outside (below). A confined
        # process is the leader of its own group; Landlock scopes its signals from ABI 6.
        unseen = {"signal it through SIGIO", "signal the whole group", "signal everyone"}
        done = {what for what, result in outcome.items() if result == "done"}
        assert done <= unseen, (where, done)
    _delivered(expected=False)
    assert not (Path(pool[3]) / "new").exists()


def signal_self_run_a_program_and_pair_sockets() -> list[str]:
    received: list[str] = []
    signal.signal(signal.SIGUSR1, lambda *_: received.append("own signal"))
    signal.raise_signal(signal.SIGUSR1)
    os.kill(os.getpid(), 0)
    ran = subprocess.run(["echo", "a converter runs"], capture_output=True, text=True, check=True)
    ours, theirs = socket.socketpair()  # an event loop's wake-up pair: it reaches no one
    theirs.sendall(b"a socket pair")
    paired = ours.recv(64).decode()
    ours.close()
    theirs.close()
    return [*received, ran.stdout.strip(), paired]


def test_a_parse_process_still_signals_itself_runs_programs_and_pairs_sockets() -> None:
    lean = ForkServer(_nothing, resident=True)
    try:
        expected = ["own signal", "a converter runs", "a socket pair"]
        assert lean.run(signal_self_run_a_program_and_pair_sockets, (), **LIMITS) == expected
        assert run_limited(signal_self_run_a_program_and_pair_sockets, **LIMITS) == expected
    finally:
        lean.close()


def start_a_straggler(then_sleep: float) -> dict[str, Any]:
    straggler = subprocess.Popen(["sleep", "300"])
    try:
        subprocess.Popen(["sleep", "300"], start_new_session=True)
        escaped = "a new session"
    except OSError as error:
        escaped = f"refused ({error.strerror})"
    time.sleep(then_sleep)
    return {"pid": straggler.pid, "escape": escaped}


def _gone(pid: int) -> bool:
    """Ended (reaped, or a zombie awaiting its new parent)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_what_a_sandbox_starts_ends_with_it_and_cannot_leave_its_group() -> None:
    started = run_limited(lambda: start_a_straggler(0), **LIMITS)
    assert started["escape"].startswith("refused")
    assert _gone(started["pid"])
    # And when the sandbox is killed at its time limit: its pid is known only from outside.
    before = set(_sleepers())
    with contextlib.suppress(Exception):
        run_limited(lambda: start_a_straggler(30), **{**LIMITS, "timeout_s": 1.0})
    assert all(_gone(pid) for pid in set(_sleepers()) - before)


def _sleepers() -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/cmdline", "rb") as cmdline:
                if cmdline.read() == b"sleep\x00300\x00":
                    found.append(int(name))
    return found


def test_a_shielded_process_keeps_an_unisolated_child_of_its_user_out_of_its_descriptors() -> None:
    """Where namespaces are refused (Docker's default profile), a worker that runs as an
    unprivileged user is still out of reach of its parse processes."""

    def child_of(shielded: bool) -> str:
        pid = os.fork()
        if pid == 0:  # the pool process, as an unprivileged user
            code = 1
            try:
                if os.geteuid() == 0:
                    os.setresgid(65534, 65534, 65534)
                    os.setresuid(65534, 65534, 65534)
                    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # dumpable, as a process started so is
                if shielded:
                    confinement.shield_from_children()
                _read, write = os.pipe()
                pool = os.getpid()
                sandbox = os.fork()
                if sandbox == 0:
                    reopened = _attempt(lambda: os.close(os.open(f"/proc/{pool}/fd/{write}", os.O_WRONLY)))
                    os._exit(0 if reopened == "done" else 4)
                _, status = os.waitpid(sandbox, 0)
                code = os.waitstatus_to_exitcode(status)
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return {0: "reopened", 4: "refused"}.get(os.waitstatus_to_exitcode(status), "failed")

    assert child_of(shielded=False) == "reopened"
    assert child_of(shielded=True) == "refused"


def test_a_process_that_cannot_be_isolated_says_so() -> None:
    """unshare refuses a process with threads: the same path as a system that refuses it."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read)
            stop = threading.Event()
            threading.Thread(target=stop.wait, daemon=True).start()
            messages: list[str] = []
            handler = logging.Handler()
            handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
            logging.getLogger(confinement.__name__).addHandler(handler)
            isolated = confinement.isolate()
            os.write(write, f"{isolated}|{messages[0] if messages else ''}".encode())
            stop.set()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said, message = answer.read().decode().split("|", 1)
    os.waitpid(pid, 0)
    assert said == "False"
    assert "cannot have namespaces of their own" in message


def test_a_worker_shields_itself_before_it_forks_its_pool() -> None:
    """Celery's worker_init runs in the main process before the pool is forked."""
    from celery.signals import worker_init

    import workers.tasks  # noqa: F401  (connects the worker's signal handlers)

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            worker_init.send(sender=None)
            code = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0  # not dumpable


def kernel_reach() -> dict[str, str]:
    """What a hostile parser would try against the kernel: capabilities, namespaces, sockets."""
    libc = ctypes.CDLL(None, use_errno=True)

    def unshare_user() -> None:
        if libc.unshare(0x10000000) != 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

    with open("/proc/self/status", encoding="ascii") as status:
        effective = next(line.split()[1] for line in status if line.startswith("CapEff:"))
    families = {"netlink": socket.AF_NETLINK, "packet": socket.AF_PACKET, "vsock": socket.AF_VSOCK}

    def opened(family: int) -> Callable[[], None]:
        kind = socket.SOCK_STREAM if family == socket.AF_VSOCK else socket.SOCK_RAW
        return lambda: socket.socket(family, kind).close()

    tried = {f"open a {name} socket": _attempt(opened(family)) for name, family in families.items()}
    return {
        **tried,
        "a user namespace of its own": _attempt(unshare_user),
        "capabilities": "none" if int(effective, 16) == 0 else effective,
    }


def test_no_parse_process_holds_a_capability_or_makes_namespaces_or_odd_sockets() -> None:
    lean = ForkServer(_nothing, resident=True)
    full = ForkServer(_nothing)
    try:
        for outcome in (
            lean.run(kernel_reach, (), **LIMITS),
            full.run(kernel_reach, (), **LIMITS),
            run_limited(kernel_reach, **LIMITS),
        ):
            assert outcome.pop("capabilities") == "none"
            assert all(result.startswith("refused") for result in outcome.values()), outcome
    finally:
        lean.close()
        full.close()


def write_into(directory: str) -> str:
    return _attempt(lambda: os.symlink("/etc/passwd", f"{directory}/next"))


def test_a_resident_server_cannot_write_where_its_inputs_come_from(tmp_path: Path) -> None:
    """A link it left there would have the pool process, which copies the next input in, write
    the next document wherever the link points."""
    lean = ForkServer(_nothing, resident=True)
    try:
        assert lean._dirs is not None
        inbox = lean._dirs[1]
        assert lean.run(write_into, (str(inbox),), **LIMITS).startswith("refused")
        source = tmp_path / "document.txt"
        source.write_text("text")
        names = {confinement.hand_over(source, inbox).name for _ in range(3)}
        assert len(names) == 3  # and none a name it could have known
    finally:
        lean.close()
    assert not inbox.exists()  # removed with the server


def test_the_directories_of_a_killed_process_are_swept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = tmp_path / f"ragline-inbox-{dead.pid}-abc"
    left.mkdir()
    (left / "a-tenants-document").write_text("text")
    live = tmp_path / f"ragline-sandbox-{os.getpid()}-abc"
    live.mkdir()
    assert confinement.sweep_private_directories() == 1
    assert not left.exists()
    assert live.exists()


def fill_scratch() -> dict[str, Any]:
    """What a parser that writes temporary files without end gets: how much it wrote before the
    refusal, the refusal, and the file system its temporary files went to."""
    directory, written, refusal = tempfile.gettempdir(), 0, ""
    try:
        for n in range(1 << 16):
            with open(f"{directory}/{n}", "wb") as scratch:
                scratch.write(b"x" * (1 << 20))
            written += 1 << 20
    except OSError as error:
        refusal = errno_name(error.errno)
    with open("/proc/self/mountinfo", encoding="utf-8") as mounts:
        kinds = [line.split(" - ")[1].split()[0] for line in mounts if line.split()[4] == directory]
    return {"written": written, "refusal": refusal, "file system": kinds[-1] if kinds else "the worker's"}


def errno_name(number: int | None) -> str:
    import errno

    return errno.errorcode.get(number or 0, str(number))


def leave_a_file() -> list[str]:
    """The names in its temporary directory, then one more of its own."""
    directory = Path(tempfile.gettempdir())
    names = sorted(p.name for p in directory.iterdir())
    (directory / "left-by-the-last-document").write_text("a tenant's text")
    return names


def test_a_parse_process_writes_its_temporary_files_in_memory_and_no_more_than_its_memory() -> None:
    """A hostile file (or a converter it drives) writing temporary files until its time runs out
    would fill the worker's disk; each file alone was bounded, not their number."""
    scratch = 24 << 20
    lean = ForkServer(_nothing, resident=True, scratch_bytes=scratch)
    full = ForkServer(_nothing)
    limits = {**LIMITS, "memory_bytes": scratch}
    try:
        for outcome in (
            lean.run(fill_scratch, (), **limits),
            full.run(fill_scratch, (), **limits),
            run_limited(fill_scratch, **limits),
        ):
            assert outcome["refusal"] == "ENOSPC", outcome
            assert scratch - (2 << 20) <= outcome["written"] <= scratch, outcome
            assert outcome["file system"] == "tmpfs", outcome
    finally:
        lean.close()
        full.close()


def test_a_resident_server_that_kept_a_file_takes_no_other_document() -> None:
    """What a document's parse left in the resident server's directory would reach the next
    document's, another tenant's perhaps, and fill its scratch: the server retires instead."""
    lean = ForkServer(_nothing, resident=True, scratch_bytes=8 << 20)
    try:
        first = lean.pid
        assert lean.run(leave_a_file, (), **LIMITS) == []
        assert lean.run(leave_a_file, (), **LIMITS) == []  # a fresh server, a fresh directory
        assert lean.pid != first
    finally:
        lean.close()


def environment_seen(secret: str) -> dict[str, bool]:
    """Where a parse process could find `secret`, which the worker was started with."""
    with open("/proc/self/environ", "rb") as block:
        initial = block.read()
    return {
        "os.environ": any(secret in value for value in os.environ.values()),
        "/proc/self/environ": secret.encode() in initial,
    }


_ENVIRONMENT_PROBE = """
import json, os, sys
from tests.unit.test_confinement import LIMITS, _nothing, environment_seen
from workers.fork_server import ForkServer
from workers.sandbox import run_limited

secret = os.environ["RAGLINE_TEST_SECRET_SEEN"]
lean, full = ForkServer(_nothing, resident=True), ForkServer(_nothing)
try:
    seen = {
        "pool process": environment_seen(secret),
        "resident server": lean.run(environment_seen, (secret,), **LIMITS),
        "fork server's sandbox": full.run(environment_seen, (secret,), **LIMITS),
        "direct sandbox": run_limited(lambda: environment_seen(secret), **LIMITS),
    }
finally:
    lean.close()
    full.close()
json.dump(seen, sys.stdout)
"""


def test_no_parse_process_finds_a_secret_the_worker_was_started_with() -> None:
    """The secret is in the environment the worker's process began with, as a deployment's
    credentials are: unsetting it in a parse process leaves its bytes in the block that
    `/proc/self/environ` reads, which a parser that reads local files could be made to read."""
    secret = f"s3cr3t-{os.urandom(8).hex()}"
    env = {**os.environ, "RAGLINE_TEST_SECRET_SEEN": secret}
    ran = subprocess.run(
        [sys.executable, "-c", _ENVIRONMENT_PROBE],
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    seen = json.loads(ran.stdout)
    assert seen.pop("pool process") == {"os.environ": True, "/proc/self/environ": True}
    for where, places in seen.items():
        assert places == {"os.environ": False, "/proc/self/environ": False}, where

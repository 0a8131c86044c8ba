"""What a parse process can reach besides its own file: no network, no other process, no file of
the worker's.

A parser that a hostile file took over runs as the worker's own user (root, in the local stack).
Closing the descriptors it inherited (`sandbox.release_inherited`) is not enough: as that user it
could reopen a pool process's pipes through `/proc/<pid>/fd`, read its environment, connect to
Redis and OpenSearch on loopback, signal, renice or limit the worker's processes, read every
tenant's blobs and the key file, and write the worker's code and kernel settings. So every parse
process is confined in layers, each of which holds where the others are refused:

- Landlock (workers/landlock.py), set after the namespaces (it would refuse their id maps): it
  reads the interpreter, the system's libraries and settings, the code it runs and its input, and
  writes only its private directory (temporary files, the home), which its caller removes. The
  same domain keeps signals (kill, SIGIO) and abstract Unix sockets inside it, and refuses TCP.
- `isolate()`: its own user, network and mount namespaces (with `no_new_privs`): it holds no
  capability over the rest of the system, so the kernel refuses it another process's descriptors,
  memory and environment, and its only network interface is a loopback that leads nowhere.
- `hold_scratch()`: its private directory is a file system in memory of its own, as large as the
  memory it may use: what it writes there never reaches the worker's disk, and it cannot fill it
  (a file's size alone is bounded by RLIMIT_FSIZE; their number was not).
- `drop_capabilities()`: not even the capabilities its own namespace gave it.
- A seccomp filter (workers/syscall_filter.py): no call that acts on another process by its
  number, creates namespaces, opens Unix, netlink, packet or vsock sockets, or leaves the
  process group that is killed with the sandbox.
- `scrub_environment()`: the settings' secrets (`RAGLINE_*`, credentials) leave its environment,
  and their bytes in the environment block it was forked with (`/proc/self/environ`).
- `shield_from_children()`: the worker's main process, and the pool processes forked from it, are
  not dumpable: where user namespaces are refused (Docker's default seccomp profile refuses them),
  a parse process of the same unprivileged user still cannot open their `/proc` entries.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import secrets
import shutil
import tempfile
from pathlib import Path
from typing import ClassVar

from workers import landlock, syscall_filter

log = logging.getLogger(__name__)

_SECRET_NAMES = re.compile(r"^(RAGLINE_|AWS_)|PASS|SECRET|TOKEN|KEY|CRED|AUTH", re.IGNORECASE)
_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522
_LAST_CAPABILITY = 63


class _State:
    warned: ClassVar[set[str]] = set()  # what this process (and so what it forks) warned about


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _warn_once(message: str) -> None:
    if message not in _State.warned:
        _State.warned.add(message)
        log.warning(message)


def confine(private: Path, readable: list[Path], scratch_bytes: int) -> None:
    """Every layer, in order, on this freshly forked, single-threaded process: it reads what
    Landlock allows and `readable`, writes beneath `private` (at most `scratch_bytes`), which also
    holds its temporary files and home. A layer the system refuses is warned about once; the
    others still hold."""
    scrub_environment(private)
    if isolate():
        hold_scratch(private, scratch_bytes)
    abi = landlock.restrict(readable, private)
    if abi == 0:
        _warn_once("parse processes cannot be kept from the worker's files (no Landlock in this kernel)")
    drop_capabilities()
    scoped = abi >= landlock.SIGNALS_SCOPED_FROM
    if not syscall_filter.install(os.getpid(), signals_scoped=scoped):
        _warn_once("no seccomp filter for this architecture: parse processes may reach other processes")


def isolate() -> bool:
    """Move this process into user, network and mount namespaces of its own, as the same user and
    group inside as outside; False where the system refuses."""
    libc = _libc()
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET | _CLONE_NEWNS) != 0:
        _warn_once(
            "parse processes cannot have namespaces of their own "
            f"({os.strerror(ctypes.get_errno())}): as root, a parser taken over by a hostile file "
            "could reach the worker's descriptors"
        )
        return False
    # Its own ids only, which any user may map (groups it may not drop are refused first): a file
    # system of the namespace (its scratch) takes files only from users mapped in it.
    with contextlib.suppress(OSError):
        for name, value in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w", encoding="ascii") as proc:
                proc.write(value)
    return True


def hold_scratch(private: Path, limit_bytes: int) -> bool:
    """Mount a file system in memory of `limit_bytes` on `private`, seen by this process and its
    children only: nothing written there runs, outlives them or reaches the disk. False (with a
    warning) where the system refuses; `private` is then the directory on disk."""
    libc = _libc()
    options = f"size={limit_bytes},mode=0700".encode()
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    # Private first: a mount on a shared tree would show in the worker's namespace too.
    if (
        libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0
        or libc.mount(b"tmpfs", bytes(private), b"tmpfs", flags, options) != 0
    ):
        _unbounded_scratch(os.strerror(ctypes.get_errno()))
        return False
    probe = private / ".probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        probe.unlink()
    except OSError as error:  # its user is not mapped in the namespace: it could write nothing
        libc.umount2(bytes(private), 0)
        _unbounded_scratch(error.strerror or "")
        return False
    return True


def _unbounded_scratch(reason: str) -> None:
    _warn_once(f"parse processes write their temporary files to the disk, without a bound ({reason})")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def drop_capabilities() -> None:
    """No capability left, in its own user namespace or any: a new namespace gives the process
    every capability there, which the kernel's netfilter and mount code trust."""
    libc = _libc()
    for capability in range(_LAST_CAPABILITY + 1):
        libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0)  # EINVAL past the kernel's last one
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    nothing = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), nothing) != 0:
        raise OSError(ctypes.get_errno(), "could not drop the capabilities")


def scrub_environment(directory: Path) -> None:
    """No secret in the environment; temporary files and the home in `directory`, which is removed
    with everything in it when the process is done."""
    for name in [n for n in os.environ if _SECRET_NAMES.search(n)]:
        del os.environ[name]
    blank_initial_secrets()
    os.environ["TMPDIR"] = os.environ["HOME"] = str(directory)
    tempfile.tempdir = str(directory)


def blank_initial_secrets() -> int:
    """Zero the secrets' entries in the environment block this process began with; how many.

    Unsetting a variable only drops the C library's pointer to it: its bytes stay in the block
    the worker was started with, which every forked process copies and `/proc/self/environ`
    reads back, as any parser that can be made to read a local file (an XML external entity)
    would. The block is this process's own memory, so its bytes are overwritten in place.
    """
    try:
        # Fields 50 and 51 of proc(5); the command name before them may hold spaces and ")".
        fields = Path("/proc/self/stat").read_bytes().rsplit(b")", 1)[1].split()
        start, end = int(fields[47]), int(fields[48])
        block = Path("/proc/self/environ").read_bytes()
    except (OSError, IndexError, ValueError):
        return 0
    if not start or end - start != len(block):
        return 0
    blanked, offset = 0, 0
    for entry in block.split(b"\0"):
        name = entry.split(b"=", 1)[0].decode(errors="replace")
        if entry and _SECRET_NAMES.search(name):
            ctypes.memset(start + offset, 0, len(entry))
            blanked += 1
        offset += len(entry) + 1
    return blanked


_PRIVATE_DIRECTORY = re.compile(r"^ragline-(?:sandbox|parse|inbox)-(\d+)-")


def private_directory(kind: str) -> Path:
    """A new directory of a parse process (`kind`: sandbox, parse or inbox), named after the
    process that makes it and removes it, so that one left by a killed process can be found."""
    return Path(tempfile.mkdtemp(prefix=f"ragline-{kind}-{os.getpid()}-"))


def sweep_private_directories() -> int:
    """Remove the directories of processes that are gone (killed before they could); how many."""
    root = Path(tempfile.gettempdir())
    swept = 0
    for entry in root.iterdir():
        match = _PRIVATE_DIRECTORY.match(entry.name)
        if match is None or Path(f"/proc/{match.group(1)}").exists():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        swept += 1
    return swept


def hand_over(path: Path, inbox: Path) -> Path:
    """A copy of `path` for a process that reads `inbox` (and cannot write there), under a name it
    cannot guess: never through a link, never over a file that was there."""
    copy = inbox / f"{secrets.token_hex(16)}{''.join(path.suffixes[-1:])}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with path.open("rb") as source, os.fdopen(os.open(copy, flags, 0o400), "wb") as target:
        shutil.copyfileobj(source, target, 1 << 20)
    return copy


def shield_from_children() -> None:
    """Make this process (and what it forks from now on) not dumpable: its `/proc` entries then
    belong to root, and a process without CAP_SYS_PTRACE cannot open its descriptors."""
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)

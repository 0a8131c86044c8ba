"""What a parse process can reach besides its own file: no network, no other process, no file of
the worker's.

A parser that a hostile file took over runs as the worker's own user (root, in the local stack).
Closing the descriptors it inherited (`sandbox.release_inherited`) is not enough: as that user it
could reopen a pool process's pipes through `/proc/<pid>/fd`, read its environment, connect to
Redis and OpenSearch on loopback, signal, renice or limit the worker's processes, read every
tenant's blobs and the key file, and write the worker's code and kernel settings. So every parse
process is confined in layers, each of which holds where the others are refused:

- `restrict_files()` (Landlock): it reads the interpreter, the system's libraries and settings, the
  code it runs and its input, and writes only its private directory (temporary files, the home).
  The same domain keeps signals (kill, SIGIO) and abstract Unix sockets inside it, and refuses TCP.
- `isolate()`: its own user and network namespaces (with `no_new_privs`): it holds no capability
  over the rest of the system, so the kernel refuses it another process's descriptors, memory and
  environment, and its only network interface is a loopback that leads nowhere.
- `forbid_reaching_processes()`: a seccomp filter on the calls that act on another process by its
  number (signals, resource limits, scheduling, ptrace, another process's memory or descriptors)
  or take a process out of the group that is killed with the sandbox.
- `scrub_environment()`: the settings' secrets (`RAGLINE_*`, credentials) leave its environment.
- `shield_from_children()`: the worker's main process, and the pool processes forked from it, are
  not dumpable: where user namespaces are refused (Docker's default seccomp profile refuses them),
  a parse process of the same unprivileged user still cannot open their `/proc` entries.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

log = logging.getLogger(__name__)

# What a parse process may read besides the interpreter, its code and its input: shared libraries,
# the system's settings (the dynamic linker's cache, fonts, MIME types), tesseract's data, devices
# and its own /proc entries.
SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/dev", "/proc", "/sys")
_SECRET_NAMES = re.compile(r"^(RAGLINE_|AWS_)|PASS|SECRET|TOKEN|KEY|CRED|AUTH", re.IGNORECASE)

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_PR_SET_DUMPABLE = 4
_PR_SET_SECCOMP = 22
_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_MODE_FILTER = 2

# Classic BPF as seccomp runs it: load a word of `struct seccomp_data`, compare, return a verdict.
_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_IF_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_IF_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_SYSCALL_NUMBER, _ARCHITECTURE, _FIRST_ARGUMENT = 0, 4, 16  # offsets; the argument's low word
_ALLOW = 0x7FFF0000
_REFUSE = 0x00050000 | 1  # SECCOMP_RET_ERRNO with EPERM
_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_X32_SYSCALLS = 0x40000000


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


class _Calls:
    """One architecture's audit number and the numbers of the calls the filter guards."""

    def __init__(
        self, audit: int, to_self: dict[str, int], self_or_zero: dict[str, int], never: dict[str, int]
    ) -> None:
        self.audit, self.to_self, self.self_or_zero, self.never = audit, to_self, self_or_zero, never


# Signals are allowed only when their first argument (the target's pid or tgid) is the caller
# itself: Python and the C library raise signals to themselves, but nothing in a parse signals
# another process. The others act on another process's memory or descriptors, or would take a
# process it started out of the group that is killed with it.
_ARCHITECTURES = {
    "x86_64": _Calls(
        0xC000003E,
        to_self={"kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297},
        self_or_zero={
            "prlimit64": 302,
            "sched_setparam": 142,
            "sched_setscheduler": 144,
            "sched_setaffinity": 203,
            "sched_setattr": 314,
            "migrate_pages": 256,
            "move_pages": 279,
        },
        never={
            "setpriority": 141,
            "ioprio_set": 251,
            "ptrace": 101,
            "setpgid": 109,
            "setsid": 112,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "kcmp": 312,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
        },
    ),
    "aarch64": _Calls(
        0xC00000B7,
        to_self={"kill": 129, "tkill": 130, "tgkill": 131, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240},
        self_or_zero={
            "prlimit64": 261,
            "sched_setparam": 118,
            "sched_setscheduler": 119,
            "sched_setaffinity": 122,
            "sched_setattr": 274,
            "migrate_pages": 238,
            "move_pages": 239,
        },
        never={
            "setpriority": 140,
            "ioprio_set": 30,
            "ptrace": 117,
            "setpgid": 154,
            "setsid": 157,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "kcmp": 272,
            "pidfd_send_signal": 424,
            "pidfd_open": 434,
            "pidfd_getfd": 438,
        },
    ),
}


class _State:
    # Inherited by forks: a server that isolated itself has isolated its sandboxes too.
    isolated = False
    warned: ClassVar[set[str]] = set()


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def isolate() -> bool:
    """Move this single-threaded, freshly forked process into user and network namespaces of its
    own; False where the system refuses (then it is warned once per process and the other layers
    stand alone)."""
    if _State.isolated:
        return True
    libc = _libc()
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        _warn_once(
            "parse processes cannot have namespaces of their own "
            f"({os.strerror(ctypes.get_errno())}): as root, a parser taken over by a hostile file "
            "could reach the worker's descriptors"
        )
        return False
    _State.isolated = True
    return True


def forbid_reaching_processes() -> bool:
    """Install the seccomp filter (see the module's docstring) on this process and what it forks;
    False on an architecture the filter does not know."""
    calls = _ARCHITECTURES.get(platform.machine())
    if calls is None:
        log.warning("no seccomp filter for %s: parse processes may signal others", platform.machine())
        return False
    program = _program(calls, os.getpid())
    instructions = (_Instruction * len(program))(*(_Instruction(*op) for op in program))
    fprog = _Program(len(program), instructions)
    libc = _libc()
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the kernel refused the seccomp filter")
    return True


def _program(calls: _Calls, pid: int) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, constant) instructions."""
    guarded = [(number, "self") for number in calls.to_self.values()]
    guarded += [(number, "self_or_zero") for number in calls.self_or_zero.values()]
    guarded += [(number, "refuse") for number in calls.never.values()]
    # Layout (classic BPF jumps only forward): checks, allow, [self_or_zero: load the target, to
    # the second allow if 0 (the caller)], [self: load the target, allow if it is us], allow,
    # refuse, kill.
    checks = 4 + len(guarded)
    at = {
        "self_or_zero": checks + 1,
        "self": checks + 3,
        "allow": checks + 5,
        "refuse": checks + 6,
        "kill": checks + 7,
    }

    def jump(here: int, label: str) -> int:
        return at[label] - here - 1

    program = [
        (_LOAD_WORD, 0, 0, _ARCHITECTURE),
        (_JUMP_IF_EQUAL, 0, jump(1, "kill"), calls.audit),
        (_LOAD_WORD, 0, 0, _SYSCALL_NUMBER),
        (_JUMP_IF_AT_LEAST, jump(3, "kill"), 0, _X32_SYSCALLS),
    ]
    for index, (number, label) in enumerate(guarded, start=4):
        program.append((_JUMP_IF_EQUAL, jump(index, label), 0, number))
    program += [
        (_RETURN, 0, 0, _ALLOW),
        (_LOAD_WORD, 0, 0, _FIRST_ARGUMENT),
        (_JUMP_IF_EQUAL, jump(checks + 2, "allow"), 0, 0),
        (_LOAD_WORD, 0, 0, _FIRST_ARGUMENT),
        (_JUMP_IF_EQUAL, 0, 1, pid & 0xFFFFFFFF),
        (_RETURN, 0, 0, _ALLOW),
        (_RETURN, 0, 0, _REFUSE),
        (_RETURN, 0, 0, _KILL),
    ]
    return program


def private_copy(path: Path, directory: Path) -> Path:
    """A copy of `path` in `directory`, for a process that may read that directory and no blob."""
    copy = directory / f"input{''.join(path.suffixes[-1:])}"
    shutil.copyfile(path, copy)
    return copy


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446  # every arch
_LANDLOCK_VERSION = 1
_RULE_PATH_BENEATH = 1
_EXECUTE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_TCP_BIND_AND_CONNECT = 0b11  # ABI 4
_SCOPE_ABSTRACT_SOCKETS_AND_SIGNALS = 0b11  # ABI 6


def _readable_roots(extra: list[Path]) -> list[Path]:
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *SYSTEM_READABLE}
    roots = {Path(p) for p in prefixes}
    for name, module in list(sys.modules.items()):  # the code it runs: its packages' directories
        where = getattr(module, "__file__", None)
        if "." not in name and where and not any(Path(where).is_relative_to(r) for r in roots):
            roots.add(Path(where).parent if hasattr(module, "__path__") else Path(where))
    return [*roots, *extra]


def restrict_files(readable: list[Path], private: Path) -> bool:
    """Landlock this process (and what it forks): it reads `readable`, the interpreter, the code
    it imported and the system's files, writes only beneath `private`; signals and abstract
    sockets stay within it, and it neither binds nor connects TCP. False where the kernel has no
    Landlock (then it is warned once per process)."""
    libc = _libc()
    abi = libc.syscall(_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_VERSION)
    if abi < 1:
        _warn_once(
            f"parse processes cannot be kept from the worker's files ({os.strerror(ctypes.get_errno())})"
        )
        return False
    fs = _FS_RIGHTS_BY_ABI[max(v for v in _FS_RIGHTS_BY_ABI if v <= abi)]
    attr = _RulesetAttr(
        fs, _TCP_BIND_AND_CONNECT if abi >= 4 else 0, _SCOPE_ABSTRACT_SOCKETS_AND_SIGNALS if abi >= 6 else 0
    )
    size = ctypes.sizeof(_RulesetAttr) if abi >= 6 else (16 if abi >= 4 else 8)
    ruleset = libc.syscall(_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "Landlock refused the ruleset")
    try:
        rules = [(root, _EXECUTE | _READ_FILE | _READ_DIR) for root in _readable_roots(readable)]
        rules.append((private, fs))
        for path, rights in rules:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # not on this system (/lib64, a prefix that is a link's target)
            try:
                # A file takes file rights only: reading and running it.
                allowed = rights if path.is_dir() else rights & (_EXECUTE | _READ_FILE)
                rule = _PathBeneath(allowed, fd)
                if libc.syscall(_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                    raise OSError(ctypes.get_errno(), f"Landlock refused the rule for {path}")
            finally:
                os.close(fd)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "Landlock refused to restrict the process")
    finally:
        os.close(ruleset)
    return True


def _warn_once(message: str) -> None:
    if message not in _State.warned:
        _State.warned.add(message)
        log.warning(message)


def scrub_environment(directory: Path) -> None:
    """No secret in the environment; temporary files and the home in `directory`, which is removed
    with everything in it when the process is done."""
    for name in [n for n in os.environ if _SECRET_NAMES.search(n)]:
        del os.environ[name]
    os.environ["TMPDIR"] = os.environ["HOME"] = str(directory)
    tempfile.tempdir = str(directory)


def shield_from_children() -> None:
    """Make this process (and what it forks from now on) not dumpable: its `/proc` entries then
    belong to root, and a process without CAP_SYS_PTRACE cannot open its descriptors."""
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)

"""What a parse process can reach besides its own file: no network, no other process.

A parser that a hostile file took over runs as the worker's own user. Closing the descriptors it
inherited (`sandbox.release_inherited`) is not enough: the same user may reopen a pool process's
pipes and sockets through `/proc/<pid>/fd`, read its environment (secrets) through
`/proc/<pid>/environ`, connect to Redis and OpenSearch on loopback, or signal any of the user's
processes. So every parse process is confined in three layers:

- `isolate()`: its own user and network namespaces (with `no_new_privs`). In a user namespace of
  its own it holds no capability over the rest of the system, so the kernel refuses it another
  process's descriptors, memory and environment even where the worker runs as root; in a network
  namespace of its own it has no interface but a loopback that leads nowhere. Forks inherit both,
  so a server isolates itself once for all its sandboxes.
- `forbid_reaching_processes()`: a seccomp filter on the calls that act on another process (signals
  to anything but itself, ptrace, another process's memory or descriptors). Not for the fork server
  itself, which kills its sandboxes when their time is up.
- `shield_from_children()`: the worker's main process, and the pool processes forked from it, are
  not dumpable. Where user namespaces are refused (Docker's default seccomp profile refuses them),
  this keeps a parse process that runs as the same unprivileged user out of their `/proc` entries.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

log = logging.getLogger(__name__)

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

    def __init__(self, audit: int, to_self: dict[str, int], never: dict[str, int]) -> None:
        self.audit, self.to_self, self.never = audit, to_self, never


# Signals are allowed only when their first argument (the target's pid or tgid) is the caller
# itself: Python and the C library raise signals to themselves, but nothing in a parse signals
# another process. The others act on another process's memory or descriptors, or would take a
# process it started out of the group that is killed with it.
_ARCHITECTURES = {
    "x86_64": _Calls(
        0xC000003E,
        to_self={"kill": 62, "tkill": 200, "tgkill": 234, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297},
        never={
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
        never={
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
    warned = False


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
        if not _State.warned:
            _State.warned = True
            log.warning(
                "parse processes cannot have namespaces of their own (%s): a parser taken over by "
                "a hostile file could reach the network and, as root, the worker's descriptors",
                os.strerror(ctypes.get_errno()),
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
    guarded += [(number, "refuse") for number in calls.never.values()]
    # Layout: checks, allow, [self: load the target, allow if it is us], refuse, kill.
    checks = 4 + len(guarded)
    at = {"allow": checks, "self": checks + 1, "refuse": checks + 4, "kill": checks + 5}

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
        (_JUMP_IF_EQUAL, 0, 1, pid & 0xFFFFFFFF),
        (_RETURN, 0, 0, _ALLOW),
        (_RETURN, 0, 0, _REFUSE),
        (_RETURN, 0, 0, _KILL),
    ]
    return program


def shield_from_children() -> None:
    """Make this process (and what it forks from now on) not dumpable: its `/proc` entries then
    belong to root, and a process without CAP_SYS_PTRACE cannot open its descriptors."""
    _libc().prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)

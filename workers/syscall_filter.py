"""The seccomp filter of a parse process: no call that acts on another process, or on namespaces.

Classic BPF, as seccomp runs it: load a word of `struct seccomp_data` (the architecture, the call's
number, an argument's low word), compare, return a verdict. Refused calls fail with EPERM; a call
of another ABI (x32, 32-bit) kills the process, since no parse makes one.

What is refused, by the call's number and, where it decides, an argument:
- signals (kill, tkill, tgkill, sigqueue) to anything but the process itself, where Landlock does
  not already keep signals inside the sandbox (`signals_scoped`);
- resource limits, scheduling and page placement of another process (`prlimit64`, `sched_set*`,
  `migrate_pages`, `move_pages` with a pid other than 0 or its own);
- ptrace, another process's memory or descriptors, pidfds, `kcmp`; renicing and I/O priorities;
- leaving the process group that is killed with the sandbox (`setsid`, `setpgid`);
- new namespaces (`unshare`, `setns`, `clone` with a namespace flag; `clone3`, whose flags a
  filter cannot read, answers ENOSYS, and the C library falls back to `clone`) and mounts: a user
  namespace of its own would give it the capabilities that the kernel's netfilter and mount code
  trust;
- sockets other than Unix, IPv4 and IPv6 (netlink, packet, vsock: vsock ignores network
  namespaces);
- making an open file signal another process (`fcntl` F_SETOWN, F_SETOWN_EX, F_SETSIG), and
  `truncate` by path, which Landlock before ABI 3 does not guard.
"""

from __future__ import annotations

import ctypes
import platform
from dataclasses import dataclass

_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2

_LOAD_WORD = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JUMP_IF_EQUAL = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JUMP_IF_AT_LEAST = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JUMP_IF_ANY_BIT = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RETURN = 0x06  # BPF_RET | BPF_K
_SYSCALL_NUMBER, _ARCHITECTURE = 0, 4  # offsets in struct seccomp_data


def _argument(index: int) -> int:
    return 16 + 8 * index  # its low word, on the little-endian machines below


_ALLOW = 0x7FFF0000
_REFUSE = 0x00050000 | 1  # SECCOMP_RET_ERRNO with EPERM
_NO_SUCH_CALL = 0x00050000 | 38  # SECCOMP_RET_ERRNO with ENOSYS
_KILL = 0x80000000  # SECCOMP_RET_KILL_PROCESS
_X32_SYSCALLS = 0x40000000

_NAMESPACE_FLAGS = (
    0x80 | 0x20000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
)
_SOCKET_FAMILIES = (1, 2, 10)  # AF_UNIX, AF_INET, AF_INET6
_SIGNALLING_FCNTL = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX


@dataclass(frozen=True)
class _Calls:
    """One architecture's audit number and call numbers."""

    audit: int
    signals: tuple[int, ...]  # kill, tkill, tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo
    self_or_zero: tuple[int, ...]  # prlimit64, sched_setparam/scheduler/affinity/attr, migrate/move_pages
    never: tuple[int, ...]
    socket: int
    fcntl: int
    clone: int
    clone3: int


# The new mount API (open_tree .. fsmount, 428-432) and pidfd calls have one number everywhere.
_COMMON_NEVER = (424, 428, 429, 430, 431, 432, 434, 438)
_ARCHITECTURES = {
    "x86_64": _Calls(
        audit=0xC000003E,
        signals=(62, 200, 234, 129, 297),
        self_or_zero=(302, 142, 144, 203, 314, 256, 279),
        # setpriority, ioprio_set, ptrace, setpgid, setsid, process_vm_readv/writev, kcmp,
        # unshare, setns, mount, truncate
        never=(141, 251, 101, 109, 112, 310, 311, 312, 272, 308, 165, 76, *_COMMON_NEVER),
        socket=41,
        fcntl=72,
        clone=56,
        clone3=435,
    ),
    "aarch64": _Calls(
        audit=0xC00000B7,
        signals=(129, 130, 131, 138, 240),
        self_or_zero=(261, 118, 119, 122, 274, 238, 239),
        never=(140, 30, 117, 154, 157, 270, 271, 272, 97, 268, 40, 45, *_COMMON_NEVER),
        socket=198,
        fcntl=25,
        clone=220,
        clone3=435,
    ),
}


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_Instruction))]


class _Assembler:
    """Instructions with named forward jumps (classic BPF jumps only forward), resolved at the end."""

    def __init__(self) -> None:
        self._code: list[tuple[int, int | str, int | str, int]] = []
        self._labels: dict[str, int] = {}

    def label(self, name: str) -> None:
        self._labels[name] = len(self._code)

    def emit(self, code: int, k: int, true: int | str = 0, false: int | str = 0) -> None:
        self._code.append((code, true, false, k))

    def load(self, offset: int) -> None:
        self.emit(_LOAD_WORD, offset)

    def ret(self, verdict: int) -> None:
        self.emit(_RETURN, verdict)

    def program(self) -> list[tuple[int, int, int, int]]:
        def offset(here: int, target: int | str) -> int:
            if isinstance(target, int):
                return target
            jump = self._labels[target] - here - 1
            if not 0 <= jump <= 255:
                raise ValueError(f"a jump to {target} of {jump}")
            return jump

        return [(c, offset(i, t), offset(i, f), k) for i, (c, t, f, k) in enumerate(self._code)]


def program(calls: _Calls, pid: int, *, signals_scoped: bool) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jump if true, jump if false, constant) instructions."""
    asm = _Assembler()
    asm.load(_ARCHITECTURE)
    asm.emit(_JUMP_IF_EQUAL, calls.audit, false="kill")
    asm.load(_SYSCALL_NUMBER)
    asm.emit(_JUMP_IF_AT_LEAST, _X32_SYSCALLS, true="kill")
    routes: list[tuple[int, str]] = [(n, "self_or_zero") for n in calls.self_or_zero]
    routes += [(n, "refuse") for n in calls.never]
    routes += [(calls.socket, "socket"), (calls.fcntl, "fcntl"), (calls.clone, "clone")]
    routes.append((calls.clone3, "no_such_call"))
    if not signals_scoped:
        routes += [(n, "self") for n in calls.signals]
    for number, label in routes:
        asm.emit(_JUMP_IF_EQUAL, number, true=label)
    asm.ret(_ALLOW)
    asm.label("self_or_zero")
    asm.load(_argument(0))
    asm.emit(_JUMP_IF_EQUAL, 0, true="allow")
    asm.label("self")  # the target already loaded, or loaded again: the same word
    asm.load(_argument(0))
    asm.emit(_JUMP_IF_EQUAL, pid & 0xFFFFFFFF, true="allow", false="refuse")
    asm.label("socket")
    asm.load(_argument(0))
    for family in _SOCKET_FAMILIES:
        asm.emit(_JUMP_IF_EQUAL, family, true="allow")
    asm.ret(_REFUSE)
    asm.label("fcntl")
    asm.load(_argument(1))
    for command in _SIGNALLING_FCNTL:
        asm.emit(_JUMP_IF_EQUAL, command, true="refuse")
    asm.ret(_ALLOW)
    asm.label("clone")
    asm.load(_argument(0))
    asm.emit(_JUMP_IF_ANY_BIT, _NAMESPACE_FLAGS, true="refuse", false="allow")
    asm.label("no_such_call")
    asm.ret(_NO_SUCH_CALL)
    asm.label("allow")
    asm.ret(_ALLOW)
    asm.label("refuse")
    asm.ret(_REFUSE)
    asm.label("kill")
    asm.ret(_KILL)
    return asm.program()


def install(pid: int, *, signals_scoped: bool) -> bool:
    """Install the filter on this process (`pid`) and what it forks; False on an architecture it
    does not know. `signals_scoped`: Landlock keeps signals inside already, so a parse may signal
    the processes it started (a converter it waits for with a timeout)."""
    calls = _ARCHITECTURES.get(platform.machine())
    if calls is None:
        return False
    ops = program(calls, pid, signals_scoped=signals_scoped)
    instructions = (_Instruction * len(ops))(*(_Instruction(*op) for op in ops))
    fprog = _Program(len(ops), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the kernel refused the seccomp filter")
    return True

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
- sockets other than IPv4 and IPv6 (Landlock refuses TCP, and the network namespace leads
  nowhere): not netlink, packet or vsock (vsock ignores network namespaces), and not a Unix
  socket, which would connect to a service's socket in the file system (Redis's, a container
  daemon's) that Landlock does not guard; a socket pair (`socketpair`) reaches no one and stays;
- making an open file signal another process (`fcntl` F_SETOWN, F_SETOWN_EX, F_SETSIG), and
  `truncate` by path, which Landlock before ABI 3 does not guard.
"""

from __future__ import annotations

import ctypes
import platform

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
_SOCKET_FAMILIES = (2, 10)  # AF_INET, AF_INET6
_SIGNALLING_FCNTL = (8, 10, 15)  # F_SETOWN, F_SETSIG, F_SETOWN_EX


# The architectures the filter knows: their audit numbers, and the column of each in _CALLS.
_ARCHITECTURES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}
# Each guarded call: what decides it (a label of `program`), its number on x86_64, on aarch64.
_CALLS = {
    # Signals: to itself only, where Landlock does not already keep them inside.
    "kill": ("self", 62, 129),
    "tkill": ("self", 200, 130),
    "tgkill": ("self", 234, 131),
    "rt_sigqueueinfo": ("self", 129, 138),
    "rt_tgsigqueueinfo": ("self", 297, 240),
    # Another process's limits, scheduling and pages: 0 or its own pid only.
    "prlimit64": ("self_or_zero", 302, 261),
    "sched_setparam": ("self_or_zero", 142, 118),
    "sched_setscheduler": ("self_or_zero", 144, 119),
    "sched_setaffinity": ("self_or_zero", 203, 122),
    "sched_setattr": ("self_or_zero", 314, 274),
    "migrate_pages": ("self_or_zero", 256, 238),
    "move_pages": ("self_or_zero", 279, 239),
    # Never.
    "setpriority": ("refuse", 141, 140),
    "ioprio_set": ("refuse", 251, 30),
    "ptrace": ("refuse", 101, 117),
    "setpgid": ("refuse", 109, 154),
    "setsid": ("refuse", 112, 157),
    "process_vm_readv": ("refuse", 310, 270),
    "process_vm_writev": ("refuse", 311, 271),
    "kcmp": ("refuse", 312, 272),
    "unshare": ("refuse", 272, 97),
    "setns": ("refuse", 308, 268),
    "mount": ("refuse", 165, 40),
    "truncate": ("refuse", 76, 45),
    "pidfd_send_signal": ("refuse", 424, 424),
    "open_tree": ("refuse", 428, 428),
    "move_mount": ("refuse", 429, 429),
    "fsopen": ("refuse", 430, 430),
    "fsconfig": ("refuse", 431, 431),
    "fsmount": ("refuse", 432, 432),
    "pidfd_open": ("refuse", 434, 434),
    "pidfd_getfd": ("refuse", 438, 438),
    # Decided by an argument.
    "socket": ("socket", 41, 198),
    "fcntl": ("fcntl", 72, 25),
    "clone": ("clone", 56, 220),
    "clone3": ("no_such_call", 435, 435),
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


def program(machine: str, pid: int, *, signals_scoped: bool) -> list[tuple[int, int, int, int]]:
    """The filter for `machine` as (code, jump if true, jump if false, constant) instructions."""
    audit, column = _ARCHITECTURES[machine]
    asm = _Assembler()
    asm.load(_ARCHITECTURE)
    asm.emit(_JUMP_IF_EQUAL, audit, false="kill")
    asm.load(_SYSCALL_NUMBER)
    asm.emit(_JUMP_IF_AT_LEAST, _X32_SYSCALLS, true="kill")
    for route, *numbers in _CALLS.values():
        if route != "self" or not signals_scoped:
            asm.emit(_JUMP_IF_EQUAL, numbers[column], true=route)
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
    if platform.machine() not in _ARCHITECTURES:
        return False
    ops = program(platform.machine(), pid, signals_scoped=signals_scoped)
    instructions = (_Instruction * len(ops))(*(_Instruction(*op) for op in ops))
    fprog = _Program(len(ops), instructions)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "the kernel refused the seccomp filter")
    return True

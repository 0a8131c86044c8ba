"""The seccomp program, run by a small classic-BPF interpreter: each architecture's verdicts,
including the one this machine cannot run (the kernel's own verdicts are tested in
test_confinement.py)."""

from __future__ import annotations

import pytest

from workers import syscall_filter as f

PID = 4242
EPERM, ENOSYS = 0x00050001, 0x00050026


def verdict(machine: str, call: str, *args: int, scoped: bool = False, arch: int | None = None) -> int:
    audit, column = f._ARCHITECTURES[machine]
    _, *numbers = f._CALLS[call]
    number = numbers[column]
    words = {0: number, 4: audit if arch is None else arch}
    words |= {16 + 8 * i: a & 0xFFFFFFFF for i, a in enumerate(args)}
    program = f.program(machine, PID, signals_scoped=scoped)
    at, accumulator = 0, 0
    while True:
        code, true, false, k = program[at]
        if code == 0x20:
            accumulator = words.get(k, 0)
        elif code == 0x06:
            return k
        else:
            taken = {0x15: accumulator == k, 0x35: accumulator >= k, 0x45: bool(accumulator & k)}[code]
            at += true if taken else false
        at += 1


@pytest.mark.parametrize("machine", sorted(f._ARCHITECTURES))
def test_each_rule_gives_its_verdict(machine: str) -> None:
    assert verdict(machine, "kill", PID, 9) == f._ALLOW
    assert verdict(machine, "kill", PID + 1, 9) == EPERM
    assert verdict(machine, "kill", 0, 9) == EPERM
    assert verdict(machine, "kill", PID + 1, 9, scoped=True) == f._ALLOW  # Landlock scopes it
    assert verdict(machine, "prlimit64", 0) == f._ALLOW
    assert verdict(machine, "prlimit64", PID) == f._ALLOW
    assert verdict(machine, "prlimit64", 1) == EPERM
    assert verdict(machine, "ptrace", 16) == EPERM
    assert verdict(machine, "unshare", 0x10000000) == EPERM
    assert verdict(machine, "socket", 2) == f._ALLOW
    assert verdict(machine, "socket", 1) == EPERM  # Unix: a socket in the file system would answer
    assert verdict(machine, "socket", 16) == EPERM  # netlink
    assert verdict(machine, "socket", 40) == EPERM  # vsock
    assert verdict(machine, "fcntl", 3, 8) == EPERM  # F_SETOWN
    assert verdict(machine, "fcntl", 3, 1) == f._ALLOW  # F_GETFD
    assert verdict(machine, "clone", 0x11) == f._ALLOW  # a fork
    assert verdict(machine, "clone", 0x10000011) == EPERM  # with a user namespace
    assert verdict(machine, "clone3") == ENOSYS
    assert verdict(machine, "kill", PID, 9, arch=0x40000003) == f._KILL  # another ABI


def test_every_guarded_call_is_checked_on_every_architecture() -> None:
    for machine in f._ARCHITECTURES:
        checked = {op[3] for op in f.program(machine, PID, signals_scoped=False) if op[0] == 0x15}
        column = f._ARCHITECTURES[machine][1]
        assert {numbers[column] for _, *numbers in f._CALLS.values()} <= checked

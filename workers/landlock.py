"""Landlock for a parse process: what it may read and write, whoever it runs as.

It reads the interpreter, the code it imported, the system's libraries and settings (without the
password and key files of /etc), its input and what `readable` adds; it writes only beneath its
private directory. From ABI 4 it neither binds nor connects TCP; from ABI 6 its signals and
abstract Unix sockets stay inside its domain. Landlock binds root as well as any user: the blob
store, the key file, the worker's code and the kernel's settings are out of reach either way.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

# Besides the interpreter and the code: shared libraries, tesseract's data, devices, its own /proc
# entries (another process's are refused by the kernel), and /etc but for what names secrets.
SYSTEM_READABLE = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/dev", "/proc", "/sys")
ETC = Path("/etc")
ETC_SECRETS = frozenset(
    {"shadow", "shadow-", "gshadow", "gshadow-", "sudoers", "sudoers.d", "ssh", "ssl", "security", "ragline"}
)

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_GET_VERSION = 1
_RULE_PATH_BENEATH = 1
_EXECUTE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 2, 1 << 3
_FS_RIGHTS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 5: (1 << 16) - 1}
_TCP_BIND_AND_CONNECT = 0b11  # ABI 4
_SCOPE_ABSTRACT_SOCKETS_AND_SIGNALS = 0b11  # ABI 6
SIGNALS_SCOPED_FROM = 6
_PR_SET_NO_NEW_PRIVS = 38


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def readable_roots(extra: list[Path]) -> list[Path]:
    """Everything a parse process may read: see the module's docstring."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *SYSTEM_READABLE}
    roots = {Path(p) for p in prefixes}
    for name, module in list(sys.modules.items()):  # the code it runs: its packages' directories
        where = getattr(module, "__file__", None)
        if "." not in name and where and not any(Path(where).is_relative_to(r) for r in roots):
            roots.add(Path(where).parent if hasattr(module, "__path__") else Path(where))
    with os.scandir(ETC) as entries:
        roots |= {Path(e.path) for e in entries if e.name not in ETC_SECRETS}
    return [*roots, *extra]


def restrict(readable: list[Path], private: Path) -> int:
    """Restrict this process and what it forks; the Landlock ABI it had, 0 where there is none."""
    libc = ctypes.CDLL(None, use_errno=True)
    abi = int(libc.syscall(_CREATE_RULESET, None, 0, _GET_VERSION))
    if abi < 1:
        return 0
    fs = _FS_RIGHTS_BY_ABI[max(v for v in _FS_RIGHTS_BY_ABI if v <= abi)]
    tcp = _TCP_BIND_AND_CONNECT if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_SOCKETS_AND_SIGNALS if abi >= SIGNALS_SCOPED_FROM else 0
    attr = _RulesetAttr(fs, tcp, scoped)
    size = ctypes.sizeof(_RulesetAttr) if scoped else (16 if tcp else 8)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "Landlock refused the ruleset")
    try:
        rules = [(root, _EXECUTE | _READ_FILE | _READ_DIR) for root in readable_roots(readable)]
        rules.append((private, fs))
        for path, rights in rules:
            _add(libc, ruleset, path, rights)
        libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "Landlock refused to restrict the process")
    finally:
        os.close(ruleset)
    return abi


def _add(libc: ctypes.CDLL, ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # not on this system (/lib64), or a link that leads nowhere
    try:
        # A file takes file rights only: reading and running it.
        allowed = rights if os.path.isdir(f"/proc/self/fd/{fd}") else rights & (_EXECUTE | _READ_FILE)
        rule = _PathBeneath(allowed, fd)
        if libc.syscall(_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"Landlock refused the rule for {path}")
    finally:
        os.close(fd)

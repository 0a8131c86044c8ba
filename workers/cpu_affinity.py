"""Each pool process on one core: the encoder's caches stay its own.

A pool process that the scheduler moves between cores, or that takes turns on a core with
OpenSearch, the API and the parse servers, finds its caches filled by them, and the model then
costs more CPU a chunk than it does alone: on the 2-core dev machine a process walking memory on
the same core added 9 % to the encoder's CPU a chunk, the same process on the other core 2 %.
Pinned, a pool process keeps its core, and the scheduler runs the services on the others beside
it rather than between its batches. The parse servers are forked before, and stay free.

A pool process takes the core the fewest processes are pinned to, across every worker on the
machine (two worker hosts on one machine must not both take the first core); a lock makes the
choices one at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections import Counter
from pathlib import Path

LOCK = Path(tempfile.gettempdir()) / "ragline-cpu-affinity.lock"


def pin_pool_process() -> int | None:
    """Pin every thread of this process to the least taken of the cores it may run on; the core,
    or None where there is only one."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    with LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        taken = pinned_processes()
        core = min(cores, key=lambda c: (taken[c], c))
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(thread), {core})
    return core


_PF_KTHREAD = 0x00200000  # include/linux/sched.h


def pinned_processes() -> Counter[int]:
    """How many processes of the machine are pinned to each single core. Kernel threads are left
    out: each core has its own, their number comes and goes, and one more on a core made both pool
    processes of a worker take the other (a bench run's pipeline went at half its speed)."""
    counts: Counter[int] = Counter()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            allowed = os.sched_getaffinity(int(name))
            if len(allowed) == 1 and not is_kernel_thread(int(name)):
                counts[next(iter(allowed))] += 1
    return counts


def is_kernel_thread(pid: int) -> bool:
    """Whether `pid` is a kernel thread (its flags in /proc/PID/stat; the name may hold spaces
    and parentheses, so the fields are counted from its closing one)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    flags = int(stat[stat.rindex(")") + 2 :].split()[6])
    return bool(flags & _PF_KTHREAD)

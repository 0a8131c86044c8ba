"""Each pool process on one core: the encoder's caches stay its own.

A pool process that the scheduler moves between cores, or that takes turns on a core with
OpenSearch, the API and the parse servers, finds its caches filled by them, and the model then
costs more CPU a chunk than it does alone: on the 2-core dev machine a process walking memory on
the same core added 9 % to the encoder's CPU a chunk, the same process on the other core 2 %.
Pinned, a pool process keeps its core, and the scheduler runs the services on the others beside
it rather than between its batches. The parse servers are forked before, and stay free.
"""

from __future__ import annotations

import contextlib
import os


def pin_pool_process(index: int) -> int | None:
    """Pin every thread of this process to core `index` (round robin over the cores it may run
    on); the core, or None where there is only one."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    core = cores[index % len(cores)]
    for thread in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(thread), {core})
    return core

"""A pool process takes the least taken core of the machine, every thread of its with it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from workers.cpu_affinity import pin_pool_process, pinned_processes


def _in_child(pin: Callable[[], object]) -> tuple[int, str]:
    """Fork a process that pins itself with `pin` and stays pinned; its pid and what it reported."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            stop = threading.Event()
            helper = threading.Thread(target=stop.wait, daemon=True)
            helper.start()
            core = pin()
            report = (core, os.sched_getaffinity(0), os.sched_getaffinity(helper.native_id or 0))
            os.write(write, repr(report).encode() + b"\n")
            stop.wait(60)  # killed by the test before that
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        return pid, answer.readline()


def test_a_pool_process_takes_the_least_taken_core_and_its_threads_follow() -> None:
    """Another worker's pool process already holds the first core (two worker hosts on one
    machine): the new one takes another."""
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, "the test needs a machine of two cores or more"
    children = []
    try:
        neighbour, _ = _in_child(lambda: os.sched_setaffinity(0, {cores[0]}))
        children.append(neighbour)
        taken = pinned_processes()
        pool, report = _in_child(pin_pool_process)
        children.append(pool)
        core, mine, theirs = eval(report)  # noqa: S307  (our own child's repr of ints and sets)
        assert mine == theirs == {core}
        assert all(taken[core] <= taken[c] for c in cores)
        assert taken[cores[0]] >= 1
    finally:
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    assert os.sched_getaffinity(0) == set(cores)  # the caller itself is left as it was

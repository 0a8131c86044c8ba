"""A pool process takes the least taken core of the machine, every thread of its with it."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from workers.cpu_affinity import is_kernel_thread, pin_pool_process, pinned_processes


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


def test_kernel_threads_are_not_counted() -> None:
    """Each core has kernel threads of its own, in numbers that come and go: one more on the first
    core made both pool processes of one worker take the second."""
    kernel, user = 0, 0  # pinned to one core each
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if len(os.sched_getaffinity(int(name))) == 1:
                if is_kernel_thread(int(name)):
                    kernel += 1
                else:
                    user += 1
        except OSError:
            continue
    # Where kernel threads are seen (not from inside a PID namespace), they outnumber the rest.
    print(f"pinned: {kernel} kernel threads, {user} processes")
    assert abs(sum(pinned_processes().values()) - user) <= 2  # processes that came or went meanwhile
    assert not is_kernel_thread(os.getpid())

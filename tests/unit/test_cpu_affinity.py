"""Pool processes are spread over the cores, one each, every thread of theirs with them."""

from __future__ import annotations

import os
import threading

from workers.cpu_affinity import pin_pool_process


def _pinned_in_child(index: int) -> tuple[int | None, set[int], set[int]]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            stop = threading.Event()
            helper = threading.Thread(target=stop.wait, daemon=True)
            helper.start()
            core = pin_pool_process(index)
            mine = os.sched_getaffinity(0)
            theirs = os.sched_getaffinity(helper.native_id or 0)
            os.write(write, repr((core, mine, theirs)).encode())
            stop.set()
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    core, mine, theirs = eval(text)  # noqa: S307  (our own child's repr of ints and sets)
    return core, mine, theirs


def test_each_pool_process_gets_the_next_core_and_its_threads_follow() -> None:
    cores = sorted(os.sched_getaffinity(0))
    assert len(cores) >= 2, "the test needs a machine of two cores or more"
    for index in range(len(cores) + 1):
        core, mine, theirs = _pinned_in_child(index)
        assert core == cores[index % len(cores)]
        assert mine == theirs == {core}
    assert os.sched_getaffinity(0) == set(cores)  # the caller itself is left as it was

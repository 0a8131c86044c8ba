"""What the e2e tests start ends with the test process, however that ends (SIGKILL too): a worker
left behind by a killed run took the next run's tasks. Real processes, no services."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PARENT = """
import subprocess, time
from tests.e2e.helpers import bound_to_test
child = subprocess.Popen(bound_to_test(["sleep", "600"]), start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_process_started_for_a_test_ends_when_the_test_process_is_killed() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the child outlived the test process that started it"
    finally:
        for pid in (parent.pid, child):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)

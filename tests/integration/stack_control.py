"""Fault injection on the real local stack: kill, stop and start its services with the project's scripts."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shared.config import Settings

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "deploy" / "local" / "stack.sh"


def stack(action: str, service: str) -> None:
    """`stack.sh ACTION SERVICE` with the test's own environment (ports, state dir)."""
    done = subprocess.run(
        ["bash", str(STACK), action, service],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.fail(f"stack.sh {action} {service} failed:\n{done.stdout}\n{done.stderr}")


def worker_pid(settings: Settings) -> int:
    return int((settings.state_dir / "worker.pid").read_text().strip())


def kill_worker(settings: Settings) -> int:
    """SIGKILL the worker's whole process group, as a crashed host would: no cleanup runs."""
    pid = worker_pid(settings)
    os.killpg(os.getpgid(pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not _alive(pid):
            return pid
        time.sleep(0.05)
    pytest.fail(f"worker {pid} survived SIGKILL")


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie is dead; only its parent has not reaped it

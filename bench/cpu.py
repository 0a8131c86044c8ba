"""CPU seconds each local service spends during a phase: what the model shares the cores with.

A service is its process and all its descendants (the worker's pool processes and their parse
sandboxes, the JVM of each OpenSearch node); a descendant that ended during the phase is counted
through its parent's reaped-children times.
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil

from shared.config import Settings


def _pidfiles(settings: Settings) -> dict[str, list[Path]]:
    state = settings.state_dir
    return {
        "worker": [state / "worker.pid"],
        "api": [state / "api.pid"],
        "redis": [state / "redis" / "redis.pid"],
        "opensearch": sorted(state.glob("opensearch*/opensearch.pid")),
    }


def _tree_seconds(pidfile: Path) -> float:
    try:
        root = psutil.Process(int(pidfile.read_text().strip()))
        processes = [root, *root.children(recursive=True)]
    except (OSError, ValueError, psutil.Error):
        return 0.0
    total = 0.0
    for process in processes:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue  # it ended between the listing and the read
        total += t.user + t.system + t.children_user + t.children_system
    return total


class CpuMeter:
    """`with CpuMeter(settings) as cpu: ...`, then `cpu.summary()`."""

    def __init__(self, settings: Settings) -> None:
        self._pidfiles = _pidfiles(settings)
        self._start: dict[str, float] = {}
        self._end: dict[str, float] = {}
        self._wall = 0.0

    def _read(self) -> dict[str, float]:
        return {name: sum(_tree_seconds(p) for p in files) for name, files in self._pidfiles.items()}

    def __enter__(self) -> CpuMeter:
        self._start, self._wall = self._read(), time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self._end, self._wall = self._read(), time.monotonic() - self._wall

    def summary(self) -> dict[str, float]:
        """CPU seconds per service, and the wall seconds of the phase."""
        used = {name: round(self._end[name] - self._start[name], 1) for name in self._start}
        return used | {"wall_s": round(self._wall, 1)}

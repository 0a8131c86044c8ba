"""CPU seconds each local service spends during a phase: what the model shares the cores with.

A service is its process and all its descendants (the worker's pool processes and their parse
sandboxes, the JVM of each OpenSearch node); a descendant that ended during the phase is counted
through its parent's reaped-children times. OpenSearch's JIT compiler threads are also reported
on their own (`opensearch_jit`, part of `opensearch`): on 2 cores a fresh JVM's C2 compiler keeps
compiling through tens of thousands of chunks, a large share of OpenSearch's CPU. So is the
embedding model's CPU inside the worker (`worker_model`, part of `worker`), from the worker's own
metric: what is left of the worker's CPU is the pipeline's own work.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from pathlib import Path

import psutil

from shared.config import Settings
from workers.metrics import MODEL_CPU_METRIC


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


def _jit_seconds(pidfile: Path) -> float:
    """CPU seconds of the JVM's compiler threads that are alive now (HotSpot names them
    "C1 CompilerThread<n>" and "C2 CompilerThread<n>")."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        tasks = Path(f"/proc/{int(pidfile.read_text().strip())}/task")
        threads = list(tasks.iterdir())
    except (OSError, ValueError):
        return 0.0
    for thread in threads:
        try:
            if "CompilerThre" not in (thread / "comm").read_text():
                continue
            fields = (thread / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended between the listing and the read
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return total


MODEL_CPU_SERIES = f"{MODEL_CPU_METRIC}_total"


def _worker_model_seconds(settings: Settings) -> float | None:
    """The worker's embedding-model CPU seconds so far, from the metrics endpoint its log names;
    None when it serves none, or only its main process's figures, or cannot be read."""
    try:
        log = (settings.state_dir / "logs" / "worker.log").read_text(errors="replace")
        served = re.findall(r"worker metrics on (http://\S+/metrics) \(all pool processes\)", log)
        if not served:
            return None
        with urllib.request.urlopen(served[-1], timeout=10) as response:  # noqa: S310  (http://, matched above)
            text = response.read().decode()
    except (OSError, ValueError):
        return None
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(MODEL_CPU_SERIES))


class CpuMeter:
    """`with CpuMeter(settings) as cpu: ...`, then `cpu.summary()`."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pidfiles = _pidfiles(settings)
        self._start: dict[str, float] = {}
        self._end: dict[str, float] = {}
        self._wall = 0.0

    def _read(self) -> dict[str, float]:
        used = {name: sum(_tree_seconds(p) for p in files) for name, files in self._pidfiles.items()}
        used["opensearch_jit"] = sum(_jit_seconds(p) for p in self._pidfiles["opensearch"])
        model = _worker_model_seconds(self._settings)
        return used if model is None else used | {"worker_model": model}

    def __enter__(self) -> CpuMeter:
        self._start, self._wall = self._read(), time.monotonic()
        return self

    def __exit__(self, *_: object) -> None:
        self._end, self._wall = self._read(), time.monotonic() - self._wall

    def summary(self) -> dict[str, float]:
        """CPU seconds per service, and the wall seconds of the phase."""
        # max: a compiler thread that ended during the phase takes its seconds out of the sum.
        used = {
            name: round(max(0.0, self._end[name] - self._start[name]), 1)
            for name in self._start
            if name in self._end
        }
        return used | {"wall_s": round(self._wall, 1)}

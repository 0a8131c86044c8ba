"""Resident memory of the worker and API processes, sampled through a run."""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from shared.config import Settings


class RssSampler:
    """Samples the resident memory of the worker and API processes once a second.

    A worker is its main process and its pool processes; the parser's forked sandboxes (their
    children) come and go with each document, so they are sampled apart (`sandbox`), or one large
    parse would read as the worker growing.
    """

    def __init__(self, settings: Settings) -> None:
        self.pids = {name: settings.state_dir / f"{name}.pid" for name in ("worker", "api")}
        self.samples: dict[str, list[float]] = {"worker": [], "api": [], "sandbox": []}
        self._stop, self._paused = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss_mb(self, pidfile: Path) -> tuple[float, float]:
        """(process and pool processes, their sandboxes) in MB."""
        try:
            root = psutil.Process(int(pidfile.read_text().strip()))
            pool = root.children()
            sandboxes = [child for process in pool for child in process.children(recursive=True)]
            own = sum(p.memory_info().rss for p in [root, *pool])
            return own / 2**20, sum(p.memory_info().rss for p in sandboxes) / 2**20
        except (OSError, ValueError, psutil.Error):
            return 0.0, 0.0

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            if self._paused.is_set():
                continue
            for name, pidfile in self.pids.items():
                own, sandboxes = self._rss_mb(pidfile)
                self.samples[name].append(own)
                if name == "worker":
                    self.samples["sandbox"].append(sandboxes)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No samples while the block runs: the bench's own work between a load's parts."""
        self._paused.set()
        try:
            yield
        finally:
            self._paused.clear()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values in self.samples.items():
            if len(values) >= 4:
                quarter = len(values) // 4
                first, last = statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
                out[name] = {
                    "peak_mb": round(max(values), 1),
                    "first_quarter_mb": round(first, 1),
                    "last_quarter_mb": round(last, 1),
                    "growth": round(last / first - 1, 4) if first else None,
                }
        return out

"""Agents polling `get_document_status` while a bulk load runs: the latency each poll sees."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

POLL_INTERVAL_S = 0.5  # an agent checking twice a second; 50 of them make 100 requests/s


def _kind(error: Exception) -> str:
    """A document polled before its upload was accepted reads 404 NOT_FOUND: told apart from failures."""
    status, code = getattr(error, "status", None), getattr(error, "code", None)
    return f"{status} {code}" if status is not None else type(error).__name__


class Pollers:
    """`count` threads, each asking for a random document's status in a loop until stopped."""

    def __init__(self, count: int, poll: Callable[[str], object], doc_ids: list[str]) -> None:
        self._poll = poll
        self._doc_ids = doc_ids
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.latencies_ms: list[float] = []
        self.errors: Counter[str] = Counter()  # by kind: "<HTTP status> <code>" or the exception's name
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(count)]

    def _run(self) -> None:
        chooser = random.Random()  # noqa: S311  (which document to ask about, not security)
        while not self._stop.wait(POLL_INTERVAL_S * chooser.uniform(0.5, 1.5)):
            started = time.perf_counter()
            try:
                self._poll(chooser.choice(self._doc_ids))
            except Exception as error:  # noqa: BLE001  (a failed poll is counted, whatever its cause)
                with self._lock:
                    self.errors[_kind(error)] += 1
                continue
            with self._lock:
                self.latencies_ms.append((time.perf_counter() - started) * 1000)

    def __enter__(self) -> Pollers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

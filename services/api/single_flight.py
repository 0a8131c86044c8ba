"""One call at a time of a blocking function that many requests want, its answer shared a moment.

Readiness probes and metrics scrapes come in bursts; each used to take a thread of the shared
pool that every sync route and search needs, and to wait on its backing services without a bound.
A `SingleFlight` runs its function in a thread of its own, one call at a time: requests that
arrive while a call is in flight wait for that call, and its answer serves every request for
`fresh_s` after it. A request waits at most `wait_s`, then gets `late()`; a call that overruns
keeps running on its own thread, and the next request after it ends starts a fresh one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio.to_thread
from anyio import CapacityLimiter

T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(
        self, call: Callable[[], T], *, fresh_s: float, wait_s: float, late: Callable[[], T]
    ) -> None:
        self._call = call
        self._fresh_s = fresh_s
        self._wait_s = wait_s
        self._late = late
        self._flight: asyncio.Task[T] | None = None
        self._answer: tuple[float, T] | None = None

    async def get(self) -> T:
        """The fresh answer, the answer of the call in flight, or that of a new call."""
        if self._answer is not None and time.monotonic() - self._answer[0] < self._fresh_s:
            return self._answer[1]
        flight = self._flight
        if flight is None or flight.done() or flight.get_loop() is not asyncio.get_running_loop():
            flight = self._flight = asyncio.ensure_future(self._run())
        try:
            # shield: a caller that gives up (its deadline, a client gone) leaves the call to the others
            return await asyncio.wait_for(asyncio.shield(flight), self._wait_s)
        except TimeoutError:
            return self._late()

    async def _run(self) -> T:
        # A limiter of its own: the call never takes one of the threads the routes share.
        answer = await anyio.to_thread.run_sync(self._call, limiter=CapacityLimiter(1))
        self._answer = (time.monotonic(), answer)
        return answer

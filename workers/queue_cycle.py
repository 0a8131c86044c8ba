"""The order a worker asks the broker for its queues: interactive first, yet bulk work never starves.

kombu's Redis transport asks for a message with one BRPOP over the worker's queues in the order a
cycle gives. Strict priority (interactive, then bulk) let a tenant that kept the interactive queue
busy (a stream of single small uploads, each within its quota of in-flight documents) stop every
bulk load, and with it the fair turns of every other tenant's bulk lane. This cycle keeps
interactive first, but after `celery.interactive_streak` deliveries in a row from queues above the
last document queue it puts that queue (and its stage queues) first for one ask. An agent's
document then waits behind at most one bulk stage now and then; a bulk load advances by at least
one stage task in `interactive_streak + 1`.

Named by its import path in `broker_transport_options["queue_order_strategy"]`; kombu builds one
per channel with no arguments, so it reads the settings itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from shared.config import Settings, get_settings
from shared.queue import lane_queues


class InteractiveFirst:
    """kombu's cycle protocol: `update` (the queues served), `consume` (an order), `rotate`."""

    def __init__(self, settings: Settings | None = None) -> None:
        settings = settings or get_settings()
        self.streak = settings.celery.interactive_streak
        self.last_tier = set(lane_queues(settings, settings.celery.queues[-1]))
        self.items: list[str] = []
        self.run = 0  # deliveries in a row from queues above the last tier

    def update(self, queues: Iterable[str]) -> None:
        self.items[:] = list(queues)

    def consume(self, n: int) -> list[str]:
        ordered = self.items[:n]
        if self.run < self.streak:
            return ordered
        return [q for q in ordered if q in self.last_tier] + [q for q in ordered if q not in self.last_tier]

    def rotate(self, last_used: str) -> str:
        self.run = 0 if last_used in self.last_tier else self.run + 1
        return last_used

    def close(self) -> None:
        """Nothing held."""

"""The worker's queue order: interactive first, and one bulk ask after a streak of interactive work."""

from __future__ import annotations

from kombu.utils.scheduling import cycle_by_name

from shared.config import load_settings
from workers.celery_app import celery_config
from workers.queue_cycle import InteractiveFirst


def _served(cycle: InteractiveFirst, waiting: dict[str, int], asks: int) -> list[str]:
    """What BRPOP would deliver over `asks` asks: the first queue in the cycle's order with work."""
    delivered = []
    for _ in range(asks):
        queue = next((q for q in cycle.consume(len(cycle.items)) if waiting.get(q)), None)
        if queue is None:
            break
        waiting[queue] -= 1
        cycle.rotate(queue)
        delivered.append(queue)
    return delivered


def test_a_busy_interactive_queue_leaves_bulk_one_ask_in_four() -> None:
    cycle = InteractiveFirst(load_settings(celery={"interactive_streak": 3}))
    cycle.update(["interactive", "bulk"])
    served = _served(cycle, {"interactive": 1000, "bulk": 1000}, 12)
    assert served == ["interactive"] * 3 + ["bulk"] + ["interactive"] * 3 + ["bulk"] + ["interactive"] * 3 + [
        "bulk"
    ]


def test_an_agent_document_still_goes_first_and_idle_queues_cost_nothing() -> None:
    cycle = InteractiveFirst(load_settings())
    cycle.update(["interactive", "bulk"])
    assert _served(cycle, {"interactive": 0, "bulk": 5}, 5) == ["bulk"] * 5
    assert _served(cycle, {"interactive": 2, "bulk": 5}, 3) == ["interactive", "interactive", "bulk"]
    assert _served(cycle, {"interactive": 5, "bulk": 0}, 5) == ["interactive"] * 5


def test_stage_queues_go_with_their_document_queue() -> None:
    settings = load_settings(celery={"stage_queues": {"embed": "{queue}-embed"}, "interactive_streak": 1})
    cycle = InteractiveFirst(settings)
    cycle.update(["interactive", "interactive-embed", "bulk", "bulk-embed"])
    assert cycle.consume(4) == ["interactive", "interactive-embed", "bulk", "bulk-embed"]
    cycle.rotate("interactive-embed")
    assert cycle.consume(4) == ["bulk", "bulk-embed", "interactive", "interactive-embed"]
    cycle.rotate("bulk-embed")
    assert cycle.consume(4)[0] == "interactive"


def test_kombu_finds_the_cycle_by_the_name_the_worker_gives() -> None:
    name = celery_config(load_settings())["broker_transport_options"]["queue_order_strategy"]
    found: object = cycle_by_name(name)
    assert found is InteractiveFirst

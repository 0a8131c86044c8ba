"""The bench's latency paths take turns, so a shared machine's drift meets each of them alike."""

from __future__ import annotations

from collections.abc import Callable

from bench.phases.latency import LATENCY_ROUNDS, taking_turns


def _recording(order: list[tuple[str, int]]) -> dict[str, Callable[[list[str]], list[float]]]:
    def path(name: str) -> Callable[[list[str]], list[float]]:
        def run(block: list[str]) -> list[float]:
            order.append((name, len(block)))
            return [float(len(q)) for q in block]

        return run

    return {name: path(name) for name in ("raw", "rest", "mcp")}


def test_paths_alternate_and_each_runs_every_query_once() -> None:
    order: list[tuple[str, int]] = []
    queries = [f"query {i}" for i in range(300)]
    out = taking_turns(_recording(order), queries, concurrency=8)
    assert {name: len(values) for name, values in out.items()} == {"raw": 300, "rest": 300, "mcp": 300}
    assert len(order) == 3 * LATENCY_ROUNDS
    firsts = [order[i * 3][0] for i in range(LATENCY_ROUNDS)]
    assert firsts[:3] == ["raw", "rest", "mcp"]  # who starts turns each round


def test_a_round_keeps_every_client_busy() -> None:
    order: list[tuple[str, int]] = []
    taking_turns(_recording(order), [f"q{i}" for i in range(75)], concurrency=32)
    assert order == [("raw", 75), ("rest", 75), ("mcp", 75)]  # too few queries to split

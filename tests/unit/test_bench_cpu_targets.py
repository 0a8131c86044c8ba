"""The report's CPU rows: the worker's and all services' CPU a chunk against the raw model's."""

from __future__ import annotations

from typing import Any

from bench.report import cpu_targets


def _ingest(worker: float, opensearch: float) -> dict[str, Any]:
    cpu = {"worker": worker, "api": 0.7, "redis": 0.3, "opensearch": opensearch, "opensearch_jit": 2.5}
    return {"raw_model": {"cpu_ms_per_chunk": 46.0}, "pii_off": {"cpu_ms_per_chunk": cpu}}


def test_both_ratios_are_held_against_their_goals() -> None:
    worker, services = cpu_targets(_ingest(50.0, 5.0))
    assert worker.startswith("| worker CPU a chunk / raw model's, PII off | 1.087 (50.0 / 46.0 ms) |")
    assert worker.endswith("| met |")
    # 50 + 0.7 + 0.3 + 5 = 56 ms: the JIT's 2.5 is inside OpenSearch's 5, not added again.
    assert "| 1.217 (56.00 ms; OpenSearch's JIT 2.5 of it) | <= 1.25 | met |" in services


def test_a_ratio_over_its_goal_is_not_met() -> None:
    worker, services = cpu_targets(_ingest(51.0, 6.0))
    assert "1.109" in worker
    assert worker.endswith("| NOT met |")
    assert "1.261" in services
    assert services.endswith("| NOT met |")


def test_a_run_without_cpu_figures_has_no_rows() -> None:
    assert cpu_targets({"raw_model": {}, "pii_off": {}}) == []

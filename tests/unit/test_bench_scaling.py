"""The report's scale curve: one host at 1, 2 and 4 worker processes, then the simulated hosts."""

from __future__ import annotations

from typing import Any

from bench.report import scale_curve


def _run(chunks_per_s: float) -> dict[str, Any]:
    return {"chunks_per_s": chunks_per_s, "raw_model": {"chunks_per_s": chunks_per_s / 0.8}}


def test_the_curve_lists_processes_in_order_then_hosts() -> None:
    r: dict[str, Any] = {"scaling": {"1": _run(14.0), "2": _run(25.0), "4": _run(24.0)}}
    r["scaling_hosts"] = _run(24.5) | {"hosts": 2}
    curve = scale_curve(r)
    assert list(curve) == [
        "1 worker process",
        "2 worker processes",
        "4 worker processes",
        "2 worker hosts of 1 process",
    ]
    assert curve["2 worker hosts of 1 process"]["chunks_per_s"] == 24.5


def test_a_run_before_the_hosts_were_measured_still_reports() -> None:
    curve = scale_curve({"scaling": {"1": _run(14.0), "2": _run(25.0)}})
    assert list(curve) == ["1 worker process", "2 worker processes"]

"""The raw model in slices between the load's parts: each slice encodes only the texts its part
added, and the slices add up to one baseline weighted by their chunks."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.phases.ingest import _new_texts, _together
from bench.report import raw_slices


def test_a_part_s_texts_are_those_it_added_repeated_texts_included() -> None:
    before = Counter(["a", "b", "b"])
    after = ["b", "c", "a", "b", "b", "d"]  # another document added one more "b"
    assert _new_texts(after, before) == ["c", "b", "d"]


def test_the_first_part_s_texts_are_all_of_them() -> None:
    assert _new_texts(["x", "x"], Counter()) == ["x", "x"]


def test_slices_together_weigh_each_by_its_chunks() -> None:
    slices = [
        {"processes": 2, "chunks": 500, "seconds": 10.0, "cpu_ms_per_chunk": 40.0},
        {"processes": 2, "chunks": 300, "seconds": 9.0, "cpu_ms_per_chunk": 60.0},
    ]
    raw = _together(slices)
    assert raw["chunks"] == 800
    assert raw["seconds"] == 19.0
    assert raw["chunks_per_s"] == pytest.approx(42.11)
    assert raw["cpu_ms_per_chunk"] == 47.5  # (500 * 40 + 300 * 60) / 800, not the slices' mean 50
    assert raw["slices_cpu_ms_per_chunk"] == [40.0, 60.0]
    assert raw["processes"] == 2


def test_the_report_names_each_slice_and_nothing_for_one_run() -> None:
    assert raw_slices({"slices_cpu_ms_per_chunk": [40.0, 60.0]}) == (
        " (by slice between the load's parts: 40.0, 60.0)"
    )
    assert raw_slices({"cpu_ms_per_chunk": 45.0}) == ""

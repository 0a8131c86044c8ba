"""The raw model in slices between the load's parts: each slice encodes only the texts its part
added, and the slices add up to one baseline weighted by their chunks."""

from __future__ import annotations

from collections import Counter

from bench.phases.sliced_load import new_texts, summed, together
from bench.report import raw_label, raw_slices, shown_seconds


def test_a_part_s_texts_are_those_it_added_repeated_texts_included() -> None:
    before = Counter(["a", "b", "b"])
    after = ["b", "c", "a", "b", "b", "d"]  # another document added one more "b"
    assert new_texts(after, before) == ["c", "b", "d"]


def test_the_first_part_s_texts_are_all_of_them() -> None:
    assert new_texts(["x", "x"], Counter()) == ["x", "x"]


def test_slices_together_weigh_each_by_the_chunks_its_part_added() -> None:
    # Samples of about the same size whatever a part's size: weighed by the sample, the small
    # part's slice would count as much as the large one's.
    slices = [
        {
            "processes": 2,
            "part_chunks": 3000,
            "chunks": 500,
            "seconds": 10.0,
            "chunks_per_s": 50.0,
            "cpu_ms_per_chunk": 40.0,
        },
        {
            "processes": 2,
            "part_chunks": 1000,
            "chunks": 500,
            "seconds": 20.0,
            "chunks_per_s": 25.0,
            "cpu_ms_per_chunk": 80.0,
        },
    ]
    raw = together(slices)
    assert raw["cpu_ms_per_chunk"] == 50.0  # (3000 * 40 + 1000 * 80) / 4000, not the samples' 60
    assert raw["chunks_per_s"] == 40.0  # 4000 chunks in 3000 / 50 + 1000 / 25 = 100 s
    assert raw["chunks"] == 1000  # the texts it encoded
    assert raw["seconds"] == 30.0
    assert raw["slices_cpu_ms_per_chunk"] == [40.0, 80.0]
    assert [s["part_chunks"] for s in raw["slices"]] == [3000, 1000]
    assert raw["processes"] == 2


def test_the_report_names_each_slice_and_nothing_for_one_run() -> None:
    assert raw_slices({"slices_cpu_ms_per_chunk": [40.0, 60.0]}) == (
        " (by slice between the load's parts: 40.0, 60.0)"
    )
    assert raw_slices({"cpu_ms_per_chunk": 45.0}) == ""


def test_cpu_seconds_add_up_over_the_parts_and_a_figure_some_part_lacks_is_left_out() -> None:
    windows = [
        {"worker": 10.0, "worker_model": 9.0, "wall_s": 5.0},
        {"worker": 20.0, "opensearch": 3.0, "wall_s": 7.0},  # the model's figure unread here
    ]
    assert summed(windows) == {"wall_s": 12.0, "worker": 30.0}


def test_the_raw_row_of_slices_weighted_by_part_says_so_and_shows_no_seconds() -> None:
    sliced = {"slices": [{}, {}], "seconds": 30.0}
    assert "2 slices" in raw_label(sliced)
    assert "weighted" in raw_label(sliced)
    assert shown_seconds(sliced) == ""
    assert raw_label({"chunks": 500}) == "sample of the same chunk texts"
    assert shown_seconds({"chunks": 500, "seconds": 12.5}) == 12.5

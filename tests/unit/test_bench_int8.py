"""The report's int8 rows: the pipeline on the int8 model against the raw fp32 model of the same run,
and its hybrid quality against the fp32 KB's."""

from __future__ import annotations

from typing import Any

from bench.report import int8_section, int8_targets


def _run(int8_chunks_per_s: float, rrf: float, min_max: float) -> dict[str, Any]:
    raw = {"processes": 2, "chunks": 2000, "seconds": 50.0, "chunks_per_s": 40.0, "cpu_ms_per_chunk": 48.0}
    fp32_quality = {
        "similarity": {"ndcg@10": 0.654},
        "hybrid_rrf": {"ndcg@10": 0.731},
        "hybrid_min_max": {"ndcg@10": 0.758},
    }
    int8_quality = {"similarity": 0.650, "hybrid_rrf": rrf, "hybrid_min_max": min_max}
    return {
        "ingest": {
            "workers": 2,
            "raw_model": raw,
            "pii_off": {"chunks": 10682, "seconds": 387.0, "chunks_per_s": 27.6, "cpu_ms_per_chunk": {}},
        },
        "quality": fp32_quality,
        "int8": {
            "model": "all-MiniLM-L6-v2-int8",
            "ingest": {
                "chunks": 10682,
                "seconds": round(10682 / int8_chunks_per_s, 1),
                "chunks_per_s": int8_chunks_per_s,
                "cpu_seconds": {"worker": 300.0},
                "cpu_ms_per_chunk": {"worker": 28.1},
            },
            "raw_model": raw | {"chunks_per_s": 60.0},
            "ratio_pipeline_to_raw_fp32": round(int8_chunks_per_s / 40.0, 3),
            "ratio_pipeline_to_raw_int8": round(int8_chunks_per_s / 60.0, 3),
            "ratio_raw_int8_to_raw_fp32": 1.5,
            "quality": {
                m: {"ndcg@10": v, "mrr@10": 0.6, "recall@100": 0.97} for m, v in int8_quality.items()
            },
            "ndcg10_minus_fp32": {
                m: round(v - fp32_quality[m]["ndcg@10"], 4) for m, v in int8_quality.items()
            },
        },
    }


def test_both_int8_targets_met() -> None:
    rows = int8_targets(_run(41.0, rrf=0.728, min_max=0.755))
    assert len(rows) == 2
    assert all(row.endswith("| met |") for row in rows), rows
    assert "1.02 (41.0 against 40.0 chunks/s)" in rows[0]
    assert "-0.0030, -0.0030" in rows[1]


def test_a_slower_pipeline_or_a_larger_drop_is_not_met() -> None:
    slow, worse = int8_targets(_run(39.0, rrf=0.731, min_max=0.752))
    assert slow.endswith("| NOT met |")
    assert worse.endswith("| NOT met |")  # min-max lost 0.006, RRF nothing


def test_a_run_without_the_int8_phase_has_no_int8_rows() -> None:
    run = _run(41.0, 0.73, 0.75)
    del run["int8"]
    assert int8_targets(run) == []
    assert int8_section(run) == []


def test_the_section_lists_both_models_and_the_quality_of_each_vector_mode() -> None:
    text = "\n".join(int8_section(_run(41.0, rrf=0.728, min_max=0.760)))
    assert "| raw int8 model, 2 processes, the same texts | 2000 | 50.0 | 60.0 | 48.0 |" in text
    assert "| hybrid_min_max | 0.758 | 0.76 | +0.0020 |" in text
    assert "| keyword |" not in text

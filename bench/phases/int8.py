"""The int8 variant of the model: the whole corpus loaded into a KB on it, against the raw fp32 model
of the ingest phase (the goal: at or above it), its own raw model beside, and its retrieval quality
beside the fp32 KB's.

The load runs right after the fp32 one, with the same worker processes and a cold embedding cache,
in one piece: its goal is throughput, which parts would cut by a ramp and a drain each. The raw
int8 model encodes each slice of the raw fp32 model's texts in turn, weighted as that slice is.
"""

from __future__ import annotations

from pathlib import Path

from bench.cpu import CpuMeter
from bench.phases.quality import mode_figures
from bench.phases.sliced_load import raw_slice, together
from bench.session import Bench

INT8_MODEL = "all-MiniLM-L6-v2-int8"
# Keyword search reads no vector: its figures are the fp32 KB's.
INT8_QUALITY_MODES = ["similarity", "hybrid_rrf", "hybrid_min_max"]


def int8_figures(bench: Bench, files: list[tuple[Path, str]], workers: int) -> str:
    """Load the corpus into a KB on the int8 model; returns that KB (the quality phase reads it)."""
    bench.say(f"ingest on {INT8_MODEL}, PII off: {len(files)} documents, {workers} worker processes")
    kb = bench.kb("int8", "off", model=INT8_MODEL)
    with CpuMeter(bench.settings) as cpu:
        run = bench.ingest(kb, files)
    run["cpu_seconds"] = cpu.summary()
    run["cpu_ms_per_chunk"] = {
        name: round(seconds / run["chunks"] * 1000, 2)
        for name, seconds in run["cpu_seconds"].items()
        if name != "wall_s"
    }
    raw = together([raw_slice(bench, sample, workers, INT8_MODEL) for sample in bench.raw_samples])
    bench.say(f"raw {INT8_MODEL}: {raw['chunks_per_s']} chunks/s on {raw['chunks']} chunk texts")
    fp32_raw = bench.results["ingest"]["raw_model"]
    bench.results["int8"] = {
        "model": INT8_MODEL,
        "kb": kb,
        "ingest": run,
        "raw_model": raw,
        # The goal: the int8 pipeline at or above the raw fp32 model, both in this run.
        "ratio_pipeline_to_raw_fp32": round(run["chunks_per_s"] / fp32_raw["chunks_per_s"], 3),
        "ratio_pipeline_to_raw_int8": round(run["chunks_per_s"] / raw["chunks_per_s"], 3),
        "ratio_raw_int8_to_raw_fp32": round(raw["chunks_per_s"] / fp32_raw["chunks_per_s"], 3),
    }
    return kb


def int8_quality(bench: Bench, kb: str, queries: dict[str, str], qrels: dict[str, set[str]]) -> None:
    """The vector modes on the int8 KB, and each one's nDCG@10 less the fp32 KB's."""
    figures = mode_figures(bench, kb, queries, qrels, INT8_QUALITY_MODES)
    fp32 = bench.results["quality"]
    bench.results["int8"]["quality"] = figures
    bench.results["int8"]["ndcg10_minus_fp32"] = {
        mode: round(figures[mode]["ndcg@10"] - fp32[mode]["ndcg@10"], 4) for mode in INT8_QUALITY_MODES
    }

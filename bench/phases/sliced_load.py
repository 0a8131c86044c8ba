"""A measured load in parts, with the raw model in as many processes after each part.

This machine's speed drifts within minutes by more than the CPU targets' margins: one raw model
run after a load of nine minutes measured the machine of that minute, not the load's. Slices
after each part sample it across the load's own minutes, and each is weighted by the chunks its
part added, as the load's CPU a chunk weighs them. The fp32 and the int8 loads both run so.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from pathlib import Path
from typing import Any

from bench.baselines import Sample
from bench.cpu import CpuMeter
from bench.rss import RssSampler
from bench.session import Bench

# The load runs in parts with the raw model after each, so that the baseline follows the machine
# across the whole load, not only once after it.
PARTS, PARTS_QUICK = 4, 2


def raw_slice(bench: Bench, sample: Sample, workers: int, model: str | None = None) -> dict[str, Any]:
    """The raw `model` (default: the configured one) on one slice's texts."""
    return bench.raw_model_on(sample.texts, workers, model) | {"part_chunks": sample.part_chunks}


def new_texts(texts: list[str], before: Counter[str]) -> list[str]:
    """`texts` less those already counted in `before` (a KB's texts before a part was loaded)."""
    left, new = before.copy(), []
    for text in texts:
        if left[text]:
            left[text] -= 1
        else:
            new.append(text)
    return new


def together(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw model's slices as one baseline, each weighted by the chunks its part added (as the
    load's CPU a chunk weighs them), not by its sample's size; and each slice's own figures, which
    show how far the machine's speed moved during the load. `chunks` and `seconds` are what the
    slices encoded and took: weighted by part, `chunks_per_s` is not their quotient."""
    added = sum(s["part_chunks"] for s in slices)
    return {
        "processes": slices[0]["processes"],
        "chunks": sum(s["chunks"] for s in slices),
        "seconds": round(sum(s["seconds"] for s in slices), 2),
        "chunks_per_s": round(added / sum(s["part_chunks"] / s["chunks_per_s"] for s in slices), 2),
        "cpu_ms_per_chunk": round(sum(s["cpu_ms_per_chunk"] * s["part_chunks"] for s in slices) / added, 2),
        "slices_cpu_ms_per_chunk": [s["cpu_ms_per_chunk"] for s in slices],
        "slices": [
            {key: s[key] for key in ("part_chunks", "chunks", "chunks_per_s", "cpu_ms_per_chunk")}
            for s in slices
        ],
    }


def summed(windows: list[dict[str, float]]) -> dict[str, float]:
    """The services' CPU seconds over all the parts' windows. A figure some window lacks (the
    worker's model CPU, when its metrics could not be read at a window's edge) is left out, not
    summed over the windows that have it."""
    names = set().union(*windows)
    return {
        name: round(sum(w[name] for w in windows), 1)
        for name in sorted(names)
        if all(name in w for w in windows)
    }


def load_beside_raw_model(
    bench: Bench,
    kb: str,
    files: list[tuple[Path, str]],
    workers: int,
    *,
    rss: RssSampler | None = None,
) -> tuple[dict[str, Any], dict[str, Any], list[Sample]]:
    """The load in parts, each followed by the raw model on an even sample of the chunk texts that
    part added; returns the load (with the services' CPU seconds), the raw model, and each
    slice's texts with the chunks its part added (another model's raw run encodes the same).

    The services' CPU counts over each part, from its first submit until OpenSearch has merged
    what it wrote; not over the bench's reads of the part's texts, nor while the raw model runs,
    which waits for OpenSearch's merges so as not to share the cores with them. `rss` samples
    only the parts, not the raw model's runs between them.
    """
    parts = PARTS_QUICK if bench.quick else PARTS
    size = -(-len(files) // parts)
    slices_planned = -(-len(files) // size)
    loads: list[dict[str, Any]] = []
    windows: list[dict[str, float]] = []
    slices: list[dict[str, Any]] = []
    samples: list[Sample] = []
    loaded: Counter[str] = Counter()
    index, unsettled = None, 0
    for first in range(0, len(files), size):
        with CpuMeter(bench.settings) as cpu:
            loads.append(bench.ingest(kb, files[first : first + size]))
            index = index or bench.index_of(kb)
            unsettled += not bench.await_merges(index)
        windows.append(cpu.summary())
        with rss.paused() if rss else contextlib.nullcontext():
            texts = bench.chunk_texts(kb, required=False)
            added = new_texts(texts, loaded)
            loaded = Counter(texts)
            if not added:
                continue  # a part whose documents all failed adds nothing to weigh
            samples.append(Sample(bench.raw_sample(added, slices_planned), len(added)))
            unsettled += not bench.await_merges(index)  # the read above refreshed the index
            slices.append(raw_slice(bench, samples[-1], workers))
    if not slices:
        raise SystemExit(f"bench: the measured load of {kb} stored no chunks")
    seconds, chunks = sum(run["seconds"] for run in loads), loads[-1]["chunks"]
    run = {
        "documents": len(files),
        "parts": len(loads),
        "seconds": round(seconds, 2),
        "chunks": chunks,
        "docs_per_s": round(len(files) / seconds, 2),
        "chunks_per_s": round(chunks / seconds, 2),
        "outcomes": dict(sum((Counter(r["outcomes"]) for r in loads), Counter())),
        "statuses": dict(sum((Counter(r["statuses"]) for r in loads), Counter())),
        "cpu_seconds": summed(windows),
        # Waits for OpenSearch's merges that ran out: a window then closed, or a slice ran, while
        # merges still ran.
        "merge_waits_timed_out": unsettled,
    }
    run["cpu_ms_per_chunk"] = {
        name: round(used / chunks * 1000, 2) for name, used in run["cpu_seconds"].items() if name != "wall_s"
    }
    return run, together(slices), samples

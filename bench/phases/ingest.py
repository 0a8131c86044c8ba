"""The whole corpus loaded with PII off, after a warm-up, in parts, with the raw model in as many
processes after each part."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.baselines import restart_worker
from bench.corpus import write_corpus
from bench.cpu import CpuMeter
from bench.rss import RssSampler
from bench.session import Bench
from shared.search import chunk_index

# Throwaway documents loaded before the counted ones.
WARMUP, WARMUP_QUICK = 100, 12
# The warm-up loads its pages again into new KBs, from the embedding cache, until OpenSearch's
# compiler takes at most this share of OpenSearch's CPU in a round (or the rounds run out).
SETTLED_JIT_SHARE = 0.25
WARM_ROUNDS, WARM_ROUNDS_QUICK = 16, 2
# Parts of the measured load: the raw model runs after each, so its baseline follows the machine's
# speed through the load rather than in one minute after it.
PARTS, PARTS_QUICK = 4, 2


def warm_opensearch(bench: Bench, files: list[tuple[Path, str]]) -> None:
    """Throwaway loads before the measured ones, each deleted after it.

    `make bench` starts the local stack when it is down, and a new JVM compiles its hot paths while
    its first loads run: a cost of each OpenSearch start, not of the pipeline (the raw model is
    warmed up before its clock starts too). On 2 cores its C2 compiler works through tens of
    thousands of chunks, more than a measured load holds: so after a first load, which embeds and
    warms the worker, the same pages go again into new KBs from the embedding cache, which costs
    OpenSearch a whole load's work and the worker little, until the compiler has settled. Then the
    deleted warm-up chunks are merged away, so that the measured load does not pay for them. Each
    round is reported, and the measured phases report the compiler's share (`opensearch_jit`).
    """
    bench.say(f"warm-up: {len(files)} documents into throwaway KBs (a fresh OpenSearch JVM compiles)")
    rounds: list[dict[str, Any]] = []
    index = None
    for n in range(1 + (WARM_ROUNDS_QUICK if bench.quick else WARM_ROUNDS)):
        kb = bench.kb("warmup", "off")
        with CpuMeter(bench.settings) as cpu:
            run = bench.ingest(kb, files, cold=n == 0)
        index = index or bench.index_of(kb)
        bench.remote.delete(f"/v1/kbs/{kb}")
        used = cpu.summary()
        rounds.append(run | {"cpu_seconds": used})
        if n and used["opensearch_jit"] <= SETTLED_JIT_SHARE * used["opensearch"]:
            break
    if index:
        chunk_index.expunge_deletes(bench.client, index)
    bench.results["warmup"] = rounds[0] | {
        "settled_jit_share": SETTLED_JIT_SHARE,
        "warm_rounds": [
            {
                "chunks": r["chunks"],
                "opensearch_cpu_s": r["cpu_seconds"]["opensearch"],
                "opensearch_jit_s": r["cpu_seconds"]["opensearch_jit"],
            }
            for r in rounds[1:]
        ],
    }


def _new_texts(texts: list[str], before: Counter[str]) -> list[str]:
    """`texts` less those already counted in `before` (a KB's texts before a part was loaded)."""
    left, new = before.copy(), []
    for text in texts:
        if left[text]:
            left[text] -= 1
        else:
            new.append(text)
    return new


def _together(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """The raw model's slices as one baseline, each weighted by the chunks its part added (as the
    load's CPU a chunk weighs them), not by its sample's size; and each slice's own figures, which
    show how far the machine's speed moved during the load."""
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


def _summed(windows: list[dict[str, float]]) -> dict[str, float]:
    return {name: round(sum(w.get(name, 0.0) for w in windows), 1) for name in windows[0]}


def load_beside_raw_model(
    bench: Bench, kb: str, files: list[tuple[Path, str]], workers: int
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The load in parts, each followed by the raw model on an even sample of that part's chunk
    texts; returns the load (with the services' CPU seconds), the raw model and its texts.

    This machine's speed drifts within minutes by more than the CPU targets' margins: one raw
    model run after a load of nine minutes measured the machine of that minute, not the load's.
    Slices after each part sample it across the load's own minutes. The services' CPU counts over
    each part, from its first submit until OpenSearch has merged what it wrote; not over the
    bench's reads of the part's texts, nor while the raw model runs, which waits for OpenSearch's
    merges so as not to share the cores with them.
    """
    parts = PARTS_QUICK if bench.quick else PARTS
    size = -(-len(files) // parts)
    loads: list[dict[str, Any]] = []
    windows: list[dict[str, float]] = []
    slices: list[dict[str, Any]] = []
    sample: list[str] = []
    loaded: Counter[str] = Counter()
    index = None
    for first in range(0, len(files), size):
        with CpuMeter(bench.settings) as cpu:
            loads.append(bench.ingest(kb, files[first : first + size]))
            index = index or bench.index_of(kb)
            bench.await_merges(index)
        windows.append(cpu.summary())
        texts = bench.chunk_texts(kb)
        added = _new_texts(texts, loaded)
        loaded = Counter(texts)
        if not added:
            continue  # a part whose documents all failed adds nothing to weigh
        part = bench.raw_sample(added, parts)
        bench.await_merges(index)  # the read above refreshed the index
        slices.append(bench.raw_model_on(part, workers) | {"part_chunks": len(added)})
        sample += part
    if not slices:
        raise SystemExit("bench: the measured load stored no chunks")
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
        "cpu_seconds": _summed(windows),
    }
    return run, _together(slices), sample


def ingest_figures(
    bench: Bench, docs: list[dict[str, str]], workers: int
) -> tuple[str, list[tuple[Path, str]]]:
    """The whole corpus, PII off, against the raw model in as many processes as the worker has."""
    files = write_corpus(docs, bench.work / "corpus")
    restart_worker(bench.settings, workers)
    with bench.phase("warmup"):
        warm_opensearch(bench, files[: WARMUP_QUICK if bench.quick else WARMUP])
    bench.say(f"ingest, PII off: {len(files)} documents, {workers} worker processes")
    kb_off = bench.kb("off", "off")
    with RssSampler(bench.settings) as rss:
        off, raw, bench.raw_texts = load_beside_raw_model(bench, kb_off, files, workers)
    bench.say(
        f"raw model: {raw['chunks_per_s']} chunks/s on {raw['chunks']} chunk texts, in "
        f"{len(raw['slices_cpu_ms_per_chunk'])} slices"
    )
    off["per_stage_ms_per_chunk"] = bench.stage_costs(kb_off, off["chunks"])
    off["cpu_ms_per_chunk"] = {
        name: round(seconds / off["chunks"] * 1000, 2)
        for name, seconds in off["cpu_seconds"].items()
        if name != "wall_s"
    }
    bench.results["ingest"] = {
        "pii_off": off,
        "raw_model": raw,
        "ratio_pipeline_to_raw_pii_off": round(off["chunks_per_s"] / raw["chunks_per_s"], 3),
        "cpu_ratio_raw_to_worker": round(raw["cpu_ms_per_chunk"] / off["cpu_ms_per_chunk"]["worker"], 3),
        "workers": workers,
    }
    bench.results["memory"] = rss.summary()
    bench.results["index"] = bench.index_size(kb_off)
    return kb_off, files

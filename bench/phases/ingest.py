"""The whole corpus loaded with PII off, after a warm-up, in parts, with the raw model in as many
processes after each part."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.baselines import restart_worker
from bench.corpus import write_corpus
from bench.cpu import CpuMeter
from bench.phases.sliced_load import load_beside_raw_model
from bench.rss import RssSampler
from bench.session import Bench
from shared.search import chunk_index

# Throwaway documents loaded before the counted ones.
WARMUP, WARMUP_QUICK = 100, 12
# The warm-up loads its pages again into new KBs, from the embedding cache, until OpenSearch's
# compiler takes at most this share of OpenSearch's CPU in a round (or the rounds run out).
SETTLED_JIT_SHARE = 0.25
WARM_ROUNDS, WARM_ROUNDS_QUICK = 16, 2


def warm_opensearch(bench: Bench, files: list[tuple[Path, str]]) -> None:
    """Throwaway loads before the measured ones, deleted after the last.

    `make bench` starts the local stack when it is down, and a new JVM compiles its hot paths while
    its first loads run: a cost of each OpenSearch start, not of the pipeline (the raw model is
    warmed up before its clock starts too). On 2 cores its C2 compiler works through tens of
    thousands of chunks, more than a measured load holds: so after a first load, which embeds and
    warms the worker, the same pages go again into new KBs from the embedding cache, which costs
    OpenSearch a whole load's work and the worker little, until the compiler has settled. (Deleting
    a KB removes the cache entries its documents wrote, so none goes before the last round.) Then
    the deleted warm-up chunks are merged away, so that the measured load does not pay for them.
    Each round is reported, and the measured phases report the compiler's share (`opensearch_jit`).
    """
    bench.say(f"warm-up: {len(files)} documents into throwaway KBs (a fresh OpenSearch JVM compiles)")
    rounds: list[dict[str, Any]] = []
    index, kbs = None, []
    for n in range(1 + (WARM_ROUNDS_QUICK if bench.quick else WARM_ROUNDS)):
        kbs.append(kb := bench.kb("warmup", "off"))
        with CpuMeter(bench.settings) as cpu:
            run = bench.ingest(kb, files, cold=n == 0)
        index = index or bench.index_of(kb)
        used = cpu.summary()
        rounds.append(run | {"cpu_seconds": used})
        if n and used["opensearch_jit"] <= SETTLED_JIT_SHARE * used["opensearch"]:
            break
    for kb in kbs:
        bench.remote.delete(f"/v1/kbs/{kb}")
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
        off, raw, bench.raw_samples = load_beside_raw_model(bench, kb_off, files, workers, rss=rss)
    bench.say(
        f"raw model: {raw['chunks_per_s']} chunks/s on {raw['chunks']} chunk texts, in "
        f"{len(raw['slices_cpu_ms_per_chunk'])} slices"
    )
    off["per_stage_ms_per_chunk"] = bench.stage_costs(kb_off, off["chunks"])
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

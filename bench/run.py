"""Runs the benchmark against the local stack and writes bench/results/<stamp>.{json,md} and plots.

Every figure is measured next to its baseline in the same run on the same machine:
pipeline chunks/s against the raw model on the same chunk texts, the int8 model's pipeline against
the raw fp32 model, REST search latency against the same embedding + `_msearch` sent straight to
OpenSearch, MCP against REST, retrieval quality against the reference figures of the team's eval
README (the int8 model's against the fp32 model's). Each phase is a module of `bench.phases`.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from rich.console import Console

from bench.baselines import restart_worker
from bench.corpus import CORPUS_QUICK, manbench
from bench.phases.ingest import ingest_figures
from bench.phases.int8 import int8_figures, int8_quality
from bench.phases.latency import LATENCY_QUERIES, LATENCY_QUERIES_QUICK, latency_figures
from bench.phases.quality import quality_figures
from bench.phases.reingest import reingest_figures
from bench.phases.scaling import SUBSET, SUBSET_QUICK, scaling_figures
from bench.phases.sources import sources_figures
from bench.report import cpu_targets, raw_slices, sources_table, write_report
from bench.session import Bench
from shared.config import REPO_ROOT, Settings


def _cache() -> Path:
    """The local stack's artifact cache (deploy/local/lib.sh reads the same variable)."""
    return Path(os.environ.get("RAGLINE_CACHE_DIR") or Path.home() / ".cache" / "ragline")


def _results() -> Path:
    out = REPO_ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    return out


def main(settings: Settings, server: str, api_key: str, quick: bool) -> Path:
    console = Console()
    bench = Bench(settings, server, api_key, quick, console)
    started = time.monotonic()
    corpus, queries, qrels = manbench(_cache())
    docs = corpus[:CORPUS_QUICK] if quick else corpus
    included = {d["_id"] for d in docs}
    judged = {q: rel & included for q, rel in qrels.items() if rel & included}
    query_texts = {q: queries[q] for q in sorted(judged)}
    bench.results["corpus"] = {"documents": len(docs), "queries": len(query_texts), "source": "manbench"}
    out = _results()
    path = out / f"{bench.stamp}.json"

    def save() -> None:  # after every phase, so a run cut short still leaves its figures
        bench.results["seconds"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(bench.results, indent=2))

    workers = os.cpu_count() or 1
    try:
        with bench.phase("ingest"):
            kb, files = ingest_figures(bench, docs, workers)
        save()
        with bench.phase("int8"):
            kb_int8 = int8_figures(bench, files, workers)
        save()
        with bench.phase("reingest"):
            reingest_figures(bench, kb, files)
        save()
        with bench.phase("scaling_and_pii"):
            scaling_figures(bench, files[: SUBSET_QUICK if quick else SUBSET], workers)
        save()
    finally:
        restart_worker(settings, settings.celery.worker_concurrency)
    sample = list(query_texts.values())[: LATENCY_QUERIES_QUICK if quick else LATENCY_QUERIES]
    with bench.phase("latency"):
        latency_figures(bench, kb, sample, server, api_key)
    save()
    with bench.phase("quality"):
        quality_figures(bench, kb, query_texts, judged)
        int8_quality(bench, kb_int8, query_texts, judged)
    save()
    with bench.phase("sources"):
        sources_figures(bench)
    save()
    write_report(bench.results, out / f"{bench.stamp}.md", out)
    bench.drop_kbs()
    shutil.rmtree(bench.work, ignore_errors=True)
    console.print(f"bench: wrote {path} and {path.with_suffix('.md')}")
    return path


def only_ingest(settings: Settings, server: str, api_key: str, quick: bool) -> Path:
    """The ingest phase alone (the whole-corpus load, its CPU a chunk per service against the raw
    model's, memory and index bytes): bench/results/<stamp>-ingest.{json,md}."""
    bench = Bench(settings, server, api_key, quick, Console())
    corpus, _, _ = manbench(_cache())
    docs = corpus[:CORPUS_QUICK] if quick else corpus
    path = _results() / f"{bench.stamp}-ingest.json"
    try:
        with bench.phase("ingest"):
            ingest_figures(bench, docs, os.cpu_count() or 1)
        # Written before the worker's restart, which a failure must not take the figures with.
        path.write_text(json.dumps(bench.results, indent=2))
        ingest = bench.results["ingest"]
        raw = ingest["raw_model"]
        baseline = f"raw model CPU ms a chunk: {raw['cpu_ms_per_chunk']}{raw_slices(raw)}"
        path.with_suffix(".md").write_text("\n".join([*cpu_targets(ingest), "", baseline]) + "\n")
    finally:
        restart_worker(settings, settings.celery.worker_concurrency)
    bench.drop_kbs()
    shutil.rmtree(bench.work, ignore_errors=True)
    bench.console.print(f"bench: wrote {path} and {path.with_suffix('.md')}")
    return path


def only_sources(settings: Settings, server: str, api_key: str, quick: bool) -> Path:
    """The sources phase alone: bench/results/<stamp>-sources.{json,md}."""
    bench = Bench(settings, server, api_key, quick, Console())
    with bench.phase("sources"):
        sources_figures(bench)
    path = _results() / f"{bench.stamp}-sources.json"
    path.write_text(json.dumps(bench.results, indent=2))
    path.with_suffix(".md").write_text("\n".join(sources_table(bench.results["sources"])) + "\n")
    bench.console.print(f"bench: wrote {path} and {path.with_suffix('.md')}")
    return path

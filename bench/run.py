"""Runs the benchmark against the local stack and writes bench/results/<stamp>.{json,md} and plots.

Every figure is measured next to its baseline in the same run on the same machine:
pipeline chunks/s against the raw model on the same chunk texts, REST search latency against
the same embedding + `_msearch` sent straight to OpenSearch, MCP against REST, retrieval quality
against the reference figures of the team's eval README.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from bench.baselines import forget_embeddings, raw_model, restart_worker
from bench.cpu import CpuMeter
from bench.mcp_latency import client_validation_ms, mcp_search_ms, paired_ms
from bench.pollers import Pollers
from bench.quality import evaluate, max_pool
from client.bulk import load
from client.http import Remote
from shared.config import REPO_ROOT, Settings
from shared.search import chunk_index
from shared.search.queries import fetch_body
from shared.search.requests import SearchRequest
from shared.search.schema import chunks_alias
from shared.wiring import build_services

EVAL_SCRIPT = REPO_ROOT.parent / "shared" / "eval" / "build_manbench.py"
REFERENCE = {  # ../shared/eval/README.md, outside Ragline: whole page truncated to 256 tokens, exact search
    "keyword": {"ndcg@10": 0.551, "mrr@10": 0.489, "recall@100": 0.944},
    "similarity": {"ndcg@10": 0.642, "mrr@10": 0.584, "recall@100": 0.973},
    "hybrid_rrf": {"ndcg@10": 0.683, "mrr@10": 0.621, "recall@100": 0.991},
    "hybrid_min_max": {"ndcg@10": 0.716, "mrr@10": 0.660, "recall@100": 0.990},
}
RAW_SAMPLE, RAW_SAMPLE_QUICK = 2000, 400  # chunk texts the raw model encodes: minutes, not the whole corpus
SCALING = (1, 2, 4)  # worker processes; a quick run measures 1 and the whole-corpus count only
SUBSET, SUBSET_QUICK = 50, 12  # documents of the scaling and PII runs
# Throwaway documents loaded before the counted ones; a quick run loads SUBSET_QUICK instead.
WARMUP = 100
CORPUS_QUICK = 60  # pages of a quick run: every phase, under 5 minutes on 2 cores
# Which part of the latency phase each query goes to, in turn: concurrency 8 (the target's) gets
# four of every eight, so its p95 rests on 300 queries a path, not a handful of slow ones; the
# paired MCP-REST comparison gets two, 150 pairs: its target's margin is about a millisecond.
LATENCY_PARTS = ("c1", "c8", "c8", "c8", "c8", "c32", "paired", "paired")
LATENCY_QUERIES, LATENCY_QUERIES_QUICK = 600, 40
LATENCY_ROUNDS = 5  # the paths take turns in up to this many rounds per concurrency
MODES: dict[str, dict[str, Any]] = {
    "keyword": {"mode": "keyword"},
    "similarity": {"mode": "similarity"},
    "hybrid_rrf": {"mode": "hybrid", "fusion": "rrf"},
    "hybrid_min_max": {"mode": "hybrid", "fusion": "min_max"},
}


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def taking_turns(
    paths: dict[str, Callable[[list[str]], list[float]]], queries: list[str], concurrency: int
) -> dict[str, list[float]]:
    """Each path's latencies over `queries`, the paths taking turns in rounds (who starts turning
    each round), so that a shared machine's drift during the phase meets all of them alike.

    A round holds at least four queries per client, or the concurrency would never be reached.
    """
    rounds = max(1, min(LATENCY_ROUNDS, len(queries) // (4 * concurrency)))
    out: dict[str, list[float]] = {name: [] for name in paths}
    names = list(paths)
    for i in range(rounds):
        block = queries[i::rounds]
        for name in names[i % len(names) :] + names[: i % len(names)]:
            out[name] += paths[name](block)
    return out


def _latency(values_ms: list[float]) -> dict[str, float]:
    return {
        "p50": _pct(values_ms, 0.5),
        "p95": _pct(values_ms, 0.95),
        "p99": _pct(values_ms, 0.99),
        "n": len(values_ms),
    }


def manbench(cache: Path) -> tuple[list[dict[str, str]], dict[str, str], dict[str, set[str]]]:
    """Corpus, queries and qrels, built once from Debian's man pages with the team's eval script."""
    out = cache / "manbench"
    if not (out / "qrels.tsv").is_file():
        if not EVAL_SCRIPT.is_file():
            raise SystemExit(f"the benchmark builder is missing: {EVAL_SCRIPT}")
        missing = [
            p
            for p in ("manpages", "manpages-dev", "groff-base")
            if subprocess.run(["dpkg", "-s", p], capture_output=True, check=False).returncode
        ]
        if missing:
            subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, capture_output=True)
        subprocess.run([sys.executable, str(EVAL_SCRIPT), str(out)], check=True)
    corpus = [json.loads(line) for line in (out / "corpus.jsonl").read_text().splitlines()]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (out / "queries.jsonl").read_text().splitlines())}
    qrels: dict[str, set[str]] = {}
    for line in (out / "qrels.tsv").read_text().splitlines()[1:]:
        qid, doc, _ = line.split("\t")
        qrels.setdefault(qid, set()).add(doc)
    return corpus, queries, qrels


class RssSampler:
    """Samples the resident memory of the worker and API processes once a second.

    A worker is its main process and its pool processes; the parser's forked sandboxes (their
    children) come and go with each document, so they are sampled apart (`sandbox`), or one large
    parse would read as the worker growing.
    """

    def __init__(self, settings: Settings) -> None:
        self.pids = {name: settings.state_dir / f"{name}.pid" for name in ("worker", "api")}
        self.samples: dict[str, list[float]] = {"worker": [], "api": [], "sandbox": []}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss_mb(self, pidfile: Path) -> tuple[float, float]:
        """(process and pool processes, their sandboxes) in MB."""
        try:
            root = psutil.Process(int(pidfile.read_text().strip()))
            pool = root.children()
            sandboxes = [child for process in pool for child in process.children(recursive=True)]
            own = sum(p.memory_info().rss for p in [root, *pool])
            return own / 2**20, sum(p.memory_info().rss for p in sandboxes) / 2**20
        except (OSError, ValueError, psutil.Error):
            return 0.0, 0.0

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for name, pidfile in self.pids.items():
                own, sandboxes = self._rss_mb(pidfile)
                self.samples[name].append(own)
                if name == "worker":
                    self.samples["sandbox"].append(sandboxes)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, values in self.samples.items():
            if len(values) >= 4:
                quarter = len(values) // 4
                first, last = statistics.fmean(values[:quarter]), statistics.fmean(values[-quarter:])
                out[name] = {
                    "peak_mb": round(max(values), 1),
                    "first_quarter_mb": round(first, 1),
                    "last_quarter_mb": round(last, 1),
                    "growth": round(last / first - 1, 4) if first else None,
                }
        return out


class Bench:
    def __init__(self, settings: Settings, server: str, api_key: str, quick: bool, console: Console) -> None:
        self.settings = settings
        self.remote = Remote(server, api_key)
        self.quick = quick
        self.console = console
        self.services = build_services(settings)
        self.client = self.services.client
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.work = settings.state_dir / "bench" / self.stamp
        self.results: dict[str, Any] = {
            "stamp": self.stamp,
            "quick": quick,
            "cpus": os.cpu_count(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        }

    def say(self, text: str) -> None:
        self.console.print(f"[bold]bench[/bold] {text}")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times a part of the run (the report shows where the run's minutes go)."""
        started = time.monotonic()
        try:
            yield
        finally:
            self.results.setdefault("phase_seconds", {})[name] = round(time.monotonic() - started, 1)

    def kb(self, name: str, pii: str) -> str:
        kb_id = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        self.remote.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id, "settings": {"pii_policy": pii}})
        return kb_id

    def write_corpus(self, docs: list[dict[str, str]], folder: Path) -> list[tuple[Path, str]]:
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        for doc in docs:
            path = folder / f"{doc['_id']}.txt"
            path.write_text(f"{doc['title']}\n\n{doc['text']}\n")
            files.append((path, doc["_id"]))
        return files

    def ingest(self, kb: str, files: list[tuple[Path, str]], *, cold: bool = True) -> dict[str, Any]:
        """Load `files` through the REST API and wait for all of them; `cold` empties the embedding cache."""
        if cold:
            forget_embeddings(self.settings)
        began = datetime.now(UTC)
        report = load(
            self.remote, kb, files, metadata={}, concurrency=4, wait=True, console=Console(quiet=True)
        )
        # Where some documents were unchanged, their submits may end after the last ready one.
        finished = None if report.outcomes.get("unchanged") else self.finished_after(kb, began)
        seconds = finished or report.seconds
        chunks = int(self.remote.get(f"/v1/kbs/{kb}")["chunk_count"])
        return {
            "documents": len(files),
            "seconds": round(seconds, 2),
            "chunks": chunks,
            "docs_per_s": round(len(files) / seconds, 2),
            "chunks_per_s": round(chunks / seconds, 2),
            "outcomes": dict(report.outcomes),
            "statuses": dict(report.statuses),
        }

    def finished_after(self, kb: str, began: datetime) -> float | None:
        """Seconds from `began` to the last document of `kb` that became ready or failed since
        then, by the documents' own transitions; None when none did.

        The loader's wait polls once a second, and a batch's counts come from a registry search
        that refreshes once a second: up to two seconds late, a tenth of a 50-page load's time.
        """
        ends = [
            datetime.fromisoformat(t["at"])
            for doc in self.documents(kb)
            for t in doc["transitions"]
            if t["status"] in ("ready", "failed")
        ]
        last = max((end for end in ends if end >= began), default=None)
        return (last - began).total_seconds() if last else None

    def documents(self, kb: str) -> list[dict[str, Any]]:
        docs, cursor = [], None
        while True:
            page = self.remote.get(
                f"/v1/kbs/{kb}/documents", params={"limit": 1000, **({"cursor": cursor} if cursor else {})}
            )
            docs += page["documents"]
            cursor = page["next_cursor"]
            if not cursor:
                return docs

    def chunk_texts(self, kb: str) -> list[str]:
        """The texts the pipeline embedded for `kb` (context header included), as stored."""
        texts = chunk_index.kb_chunk_texts(self.client, self.settings, kb)
        if not texts:
            raise SystemExit(f"bench: no chunks of {kb} found in {chunks_alias(self.settings)}")
        return texts

    def raw_model(self, texts: list[str], processes: int) -> dict[str, float]:
        """The bare model on an even sample of the run's own chunk texts (all of them in a quick run)."""
        sample = texts[:: max(1, len(texts) // (RAW_SAMPLE_QUICK if self.quick else RAW_SAMPLE))]
        return raw_model(self.settings, sample, processes)

    def stage_costs(self, kb: str, chunks: int) -> dict[str, float]:
        totals: dict[str, float] = {}
        for doc in self.documents(kb):
            for stage, seconds in doc["timings"].items():
                totals[stage] = totals.get(stage, 0.0) + seconds
        return {stage: round(1000 * total / max(chunks, 1), 2) for stage, total in totals.items()}

    def timed(self, concurrency: int, calls: list[Callable[[], object]]) -> list[float]:
        def one(call: Callable[[], object]) -> float:
            started = time.perf_counter()
            call()
            return (time.perf_counter() - started) * 1000

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            return list(pool.map(one, calls))

    # the parts of the run

    def warm_opensearch(self, files: list[tuple[Path, str]]) -> None:
        """A throwaway load before the measured ones, deleted after it.

        `make bench` starts the local stack when it is down, and a new JVM compiles its hot
        paths while its first loads run: a cost of each OpenSearch start, not of the pipeline (the
        raw model is warmed up before its clock starts too). On 2 cores C2 kept compiling through
        whole loads, though: 42 of OpenSearch's 102 CPU seconds in the 1,100-page load even after
        a 400-page warm-up, so a longer one buys nothing. What the warm-up cost is reported, and
        the measured phases report the compiler's share (`opensearch_jit`).
        """
        self.say(f"warm-up: {len(files)} documents into a throwaway KB (a fresh OpenSearch JVM compiles)")
        kb = self.kb("warmup", "off")
        with CpuMeter(self.settings) as cpu:
            run = self.ingest(kb, files)
        self.remote.delete(f"/v1/kbs/{kb}")
        self.results["warmup"] = run | {"cpu_seconds": cpu.summary()}

    def ingest_figures(self, docs: list[dict[str, str]], workers: int) -> tuple[str, list[tuple[Path, str]]]:
        """The whole corpus, PII off, against the raw model in as many processes as the worker has."""
        files = self.write_corpus(docs, self.work / "corpus")
        restart_worker(self.settings, workers)
        with self.phase("warmup"):
            self.warm_opensearch(files[: SUBSET_QUICK if self.quick else WARMUP])
        self.say(f"ingest, PII off: {len(files)} documents, {workers} worker processes")
        kb_off = self.kb("off", "off")
        with RssSampler(self.settings) as rss, CpuMeter(self.settings) as cpu:
            off = self.ingest(kb_off, files)
        off["cpu_seconds"] = cpu.summary()
        texts = self.chunk_texts(kb_off)
        raw = self.raw_model(texts, workers)
        self.say(
            f"raw model: {raw['chunks_per_s']} chunks/s on {raw['chunks']} of the {len(texts)} chunk texts"
        )
        off["per_stage_ms_per_chunk"] = self.stage_costs(kb_off, off["chunks"])
        off["cpu_ms_per_chunk"] = {
            name: round(seconds / off["chunks"] * 1000, 2)
            for name, seconds in off["cpu_seconds"].items()
            if name != "wall_s"
        }
        self.results["ingest"] = {
            "pii_off": off,
            "raw_model": raw,
            "ratio_pipeline_to_raw_pii_off": round(off["chunks_per_s"] / raw["chunks_per_s"], 3),
            "cpu_ratio_raw_to_worker": round(raw["cpu_ms_per_chunk"] / off["cpu_ms_per_chunk"]["worker"], 3),
            "workers": workers,
        }
        self.results["memory"] = rss.summary()
        self.results["index"] = self.index_size()
        return kb_off, files

    def scaling_figures(self, files: list[tuple[Path, str]], workers: int) -> None:
        """A subset at 1, 2 and 4 worker processes (PII off), then PII on under the same conditions.

        The PII-on run is compared with the PII-off run at `workers` processes, so that count is
        always among the measured ones.
        """
        runs: dict[str, Any] = {}
        for count in sorted({1, workers} if self.quick else {*SCALING, workers}):
            restart_worker(self.settings, count)
            self.say(f"scaling: {len(files)} documents with {count} worker process(es)")
            kb = self.kb(f"w{count}", "off")
            run = self.ingest(kb, files)
            raw = self.raw_model(self.chunk_texts(kb), count)
            runs[str(count)] = run | {
                "raw_model": raw,
                "ratio_to_raw": round(run["chunks_per_s"] / raw["chunks_per_s"], 3),
            }
        restart_worker(self.settings, workers)
        self.say(f"PII on (redact): the same {len(files)} documents, {workers} worker processes")
        kb_on = self.kb("on", "redact")
        on = self.ingest(kb_on, files)
        on["per_stage_ms_per_chunk"] = self.stage_costs(kb_on, on["chunks"])
        off = runs[str(workers)]
        self.results["scaling"] = runs
        self.results["pii"] = {
            "pii_on": on,
            "pii_off_same_documents": off,
            "ratio_pii_on_to_off_time": round(on["seconds"] / off["seconds"], 3),
        }

    def index_size(self) -> dict[str, Any]:
        chunks, size = chunk_index.merged_size(self.client, self.settings)
        count = max(1, chunks)
        return {"chunks_in_index": count, "bytes": size, "bytes_per_1000_chunks": round(size / count * 1000)}

    def reingest_figures(self, kb: str, files: list[tuple[Path, str]]) -> None:
        first = self.results["ingest"]["pii_off"]["seconds"]
        self.say("re-ingest, unchanged")
        unchanged = self.ingest(kb, files, cold=False)
        edited = files[::10]
        for path, _ in edited:
            path.write_text(path.read_text() + "\nEdited for the re-ingest benchmark.\n")
        self.say(f"re-ingest, {len(edited)} of {len(files)} edited, 50 agents polling status")
        doc_ids = [doc_id for _, doc_id in files]
        with Pollers(50, lambda d: self.remote.get(f"/v1/kbs/{kb}/documents/{d}"), doc_ids) as pollers:
            changed = self.ingest(kb, files, cold=False)  # the cache is what saves the unchanged chunks
        self.results["status_polling_ms"] = _latency(pollers.latencies_ms) | {
            "pollers": 50,
            "errors": sum(pollers.errors.values()),
            "errors_by_kind": dict(pollers.errors),
        }
        embed = [
            d.get("stats", {}).get("embed", {})
            for d in self.documents(kb)
            if d["doc_id"] in {e[1] for e in edited}
        ]
        self.results["reingest"] = {
            "unchanged": unchanged | {"fraction_of_first": round(unchanged["seconds"] / first, 4)},
            "edited": changed
            | {
                "edited_documents": len(edited),
                "fraction_of_first": round(changed["seconds"] / first, 4),
                "chunks_embedded": sum(e.get("embedded", 0) for e in embed),
                "chunks_from_cache": sum(e.get("cached", 0) for e in embed),
            },
        }

    def latency_figures(self, kb: str, queries: list[str], server: str, api_key: str) -> None:
        """Each concurrency gets its own queries and each path its own strings of them, so no path
        answers from a warm cache; the paths take turns (see `taking_turns`)."""
        searcher = self.services.searcher
        parts: dict[str, list[str]] = {part: [] for part in LATENCY_PARTS}
        for i, query in enumerate(queries):
            parts[LATENCY_PARTS[i % len(LATENCY_PARTS)]].append(query)

        tenant = chunk_index.kb_tenant(self.client, self.settings, kb)

        def raw(query: str) -> Callable[[], object]:
            def call() -> object:
                """The service's own OpenSearch requests, embedding included, sent straight: the
                arms, then the fetch of as many hits as a search returns (the arms' best, in turn)."""
                request = SearchRequest(query=query, kb_ids=[kb])
                bodies = searcher.arm_bodies(request, [{"term": {"kb_id": kb}}])
                lines: list[dict[str, Any]] = []
                for body in bodies.values():
                    lines += [{"index": searcher.index}, body]
                arms = [r["hits"]["hits"] for r in chunk_index.search_arms(self.client, lines)]
                best = dict.fromkeys(hit["_id"] for rank in zip(*arms, strict=False) for hit in rank)
                chosen = list(best)[: request.top_k]
                fetch = fetch_body(request, tenant, chosen)
                return chunk_index.fetch_hits(self.client, [searcher.index], fetch)

            return call

        def rest(query: str) -> Callable[[], object]:
            return lambda: self.remote.post("/v1/search", json={"query": query, "kb_ids": [kb]})

        def paths_at(c: int) -> dict[str, Callable[[list[str]], list[float]]]:
            """Raw, REST and MCP, each query a distinct string per path so no cache answers it."""
            return {
                "raw": lambda block: self.timed(c, [raw(q) for q in block]),
                "rest": lambda block: self.timed(c, [rest(f"{q} ") for q in block]),
                "mcp": lambda block: mcp_search_ms(server, api_key, kb, [f"{q}  " for q in block], c),
            }

        figures: dict[str, Any] = {}
        for concurrency in (1, 8, 32):
            chosen = parts[f"c{concurrency}"]
            self.say(f"query latency at concurrency {concurrency} ({len(chosen)} queries per path)")
            for name, values in taking_turns(paths_at(concurrency), chosen, concurrency).items():
                figures[f"{name}_c{concurrency}"] = _latency(values)
        figures["rest_over_raw_p95_c8"] = round(
            figures["rest_c8"]["p95"] / max(figures["raw_c8"]["p95"], 1e-6), 3
        )
        self.say(f"MCP against REST, query by query at concurrency 1 ({len(parts['paired'])} queries)")
        paired = paired_ms(server, api_key, kb, parts["paired"])
        for name, values in paired.items():
            figures[f"paired_{name}_c1"] = _latency(values)
        for name in ("mcp", "mcp_bare"):
            differences = [m - r for m, r in zip(paired[name], paired["rest"], strict=True)]
            figures[f"{name}_minus_rest_p50_ms"] = round(statistics.median(differences), 2)
        figures["mcp_client_schema_check_p50_ms"] = round(
            client_validation_ms(server, api_key, kb, queries[0]), 2
        )
        self.results["latency_ms"] = figures

    def quality_figures(self, kb: str, queries: dict[str, str], qrels: dict[str, set[str]]) -> None:
        """Rankings only, so the queries run 4 at a time: the latency phase measures speed."""
        figures: dict[str, Any] = {}
        for name, params in MODES.items():
            self.say(f"quality, {name}, {len(queries)} queries")

            def ranked(item: tuple[str, str], params: dict[str, Any] = params) -> tuple[str, list[str]]:
                qid, text = item
                body = self.remote.post(
                    "/v1/search", json={"query": text, "kb_ids": [kb], "top_k": 100, **params}
                )
                return qid, max_pool(h["doc_id"] for h in body["results"])

            with ThreadPoolExecutor(max_workers=4) as pool:
                runs = dict(pool.map(ranked, queries.items()))
            figures[name] = evaluate(runs, qrels) | {"reference": REFERENCE[name]}
        self.results["quality"] = figures


def main(settings: Settings, server: str, api_key: str, quick: bool) -> Path:
    console = Console()
    bench = Bench(settings, server, api_key, quick, console)
    started = time.monotonic()
    corpus, queries, qrels = manbench(Path.home() / ".cache" / "ragline")
    docs = corpus[:CORPUS_QUICK] if quick else corpus
    included = {d["_id"] for d in docs}
    judged = {q: rel & included for q, rel in qrels.items() if rel & included}
    query_texts = {q: queries[q] for q in sorted(judged)}
    bench.results["corpus"] = {"documents": len(docs), "queries": len(query_texts), "source": "manbench"}
    out = REPO_ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{bench.stamp}.json"

    def save() -> None:  # after every phase, so a run cut short still leaves its figures
        bench.results["seconds"] = round(time.monotonic() - started, 1)
        path.write_text(json.dumps(bench.results, indent=2))

    workers = os.cpu_count() or 1
    try:
        with bench.phase("ingest"):
            kb, files = bench.ingest_figures(docs, workers)
        save()
        with bench.phase("reingest"):
            bench.reingest_figures(kb, files)
        save()
        with bench.phase("scaling_and_pii"):
            bench.scaling_figures(files[: SUBSET_QUICK if quick else SUBSET], workers)
        save()
    finally:
        restart_worker(settings, settings.celery.worker_concurrency)
    sample = list(query_texts.values())[: LATENCY_QUERIES_QUICK if quick else LATENCY_QUERIES]
    with bench.phase("latency"):
        bench.latency_figures(kb, sample, server, api_key)
    save()
    with bench.phase("quality"):
        bench.quality_figures(kb, query_texts, judged)
    save()
    from bench.report import write_report

    write_report(bench.results, out / f"{bench.stamp}.md", out)
    shutil.rmtree(bench.work, ignore_errors=True)
    console.print(f"bench: wrote {path} and {path.with_suffix('.md')}")
    return path

"""What every phase of a benchmark run shares: the clients, the results so far, the steps of a load."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from rich.console import Console

from bench.baselines import Sample, forget_embeddings, raw_model
from client.bulk import load
from client.http import ApiError, Remote
from shared.config import Settings
from shared.search import chunk_index
from shared.search.placement import resolve
from shared.search.schema import chunks_alias
from shared.wiring import build_services

RAW_SAMPLE, RAW_SAMPLE_QUICK = 2000, 400  # chunk texts the raw model encodes: minutes, not the whole corpus
MERGE_WAIT_S = 120.0  # the longest a measurement waits for OpenSearch's merges to end


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def latency_summary(values_ms: list[float]) -> dict[str, float]:
    """p50, p95 and p99 of a list of latencies, and how many there were."""
    return {
        "p50": percentile(values_ms, 0.5),
        "p95": percentile(values_ms, 0.95),
        "p99": percentile(values_ms, 0.99),
        "n": len(values_ms),
    }


class Bench:
    """One run: its settings, its clients, its results so far, and the steps every phase uses."""

    def __init__(self, settings: Settings, server: str, api_key: str, quick: bool, console: Console) -> None:
        self.settings = settings
        self.remote = Remote(server, api_key)
        self.quick = quick
        self.console = console
        self.services = build_services(settings)
        self.client = self.services.client
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.work = settings.state_dir / "bench" / self.stamp
        self.created: list[str] = []
        # The raw fp32 model's slices of the ingest phase: other raw models encode the same texts.
        self.raw_samples: list[Sample] = []
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

    def kb(self, name: str, pii: str, model: str | None = None) -> str:
        """A new KB of this run, on `model` (default: the server's)."""
        kb_id = f"bench-{name}-{uuid.uuid4().hex[:6]}"
        body = {"kb_id": kb_id, "name": kb_id, "settings": {"pii_policy": pii}}
        self.remote.post("/v1/kbs", json=body | ({"embedding_model": model} if model else {}))
        self.created.append(kb_id)
        return kb_id

    def drop_kbs(self) -> None:
        """Delete the KBs this run made. Left behind, their chunks stayed in the shared index, and
        the next run's loads merged segments of a larger index: its OpenSearch CPU a chunk grew
        from run to run."""
        for kb_id in self.created:
            with contextlib.suppress(ApiError):  # the warm-up's is gone already
                self.remote.delete(f"/v1/kbs/{kb_id}")
        self.created.clear()

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

    def chunk_texts(self, kb: str, *, required: bool = True) -> list[str]:
        """The texts the pipeline embedded for `kb` (context header included), as stored; none
        is an error when `required`."""
        texts = chunk_index.kb_chunk_texts(self.client, self.settings, kb)
        if required and not texts:
            raise SystemExit(f"bench: no chunks of {kb} in any chunk index ({chunks_alias(self.settings)}*)")
        return texts

    def raw_sample(self, texts: list[str], slices: int = 1) -> list[str]:
        """An even sample of the run's own chunk texts (all of them in a quick run), for a raw
        model that runs in `slices` parts; the same texts give the same sample."""
        size = max(1, (RAW_SAMPLE_QUICK if self.quick else RAW_SAMPLE) // slices)
        return texts[:: max(1, len(texts) // size)]

    def raw_model(self, texts: list[str], processes: int, model: str | None = None) -> dict[str, float]:
        """The bare model on an even sample of `texts`, whichever the model."""
        return self.raw_model_on(self.raw_sample(texts), processes, model)

    def raw_model_on(self, sample: list[str], processes: int, model: str | None = None) -> dict[str, float]:
        """The bare model on exactly `sample`."""
        return raw_model(self.settings, sample, processes, model)

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

    def index_of(self, kb: str) -> str:
        """The physical chunk index that holds `kb`."""
        tenant = chunk_index.kb_tenant(self.client, self.settings, kb)
        return resolve(self.client, self.settings, [(tenant, kb)])[(tenant, kb)].index

    def await_merges(self, index: str, timeout_s: float = MERGE_WAIT_S) -> bool:
        """Once `index` runs no merge (or `timeout_s` has passed): a baseline measured next does
        not share the cores with what the load wrote."""
        return chunk_index.await_merges(self.client, index, timeout_s)

    def index_size(self, kb: str) -> dict[str, Any]:
        """The bytes a chunk of the index that holds `kb`, force-merged, in all and by part."""
        index = self.index_of(kb)
        merged = chunk_index.merged_parts(self.client, index)
        count = max(1, merged["chunks"])
        per_chunk = {part: round(size / count) for part, size in merged["parts"].items()}
        vectors = round(merged["float32_vector_bytes"] / count)
        return {
            "index": index,
            "chunks_in_index": count,
            "bytes": merged["bytes"],
            "bytes_per_1000_chunks": round(merged["bytes"] / count * 1000),
            "bytes_per_chunk": round(merged["bytes"] / count),
            "bytes_per_chunk_by_part": per_chunk,
            # The float32 vectors themselves (chunks' and first chunks' document vectors); the rest
            # of `vectors_and_graphs` is the HNSW graphs.
            "float32_vector_bytes_per_chunk": vectors,
            "recovery_sources_dropped": merged["leases_passed"],
        }

"""A subset of the corpus at 1, 2 and 4 worker processes, then with PII on under the same conditions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.baselines import restart_worker
from bench.session import Bench

SCALING = (1, 2, 4)  # worker processes; a quick run measures 1 and the whole-corpus count only
SUBSET, SUBSET_QUICK = 50, 12  # documents of the scaling and PII runs


def scaling_figures(bench: Bench, files: list[tuple[Path, str]], workers: int) -> None:
    """A subset at 1, 2 and 4 worker processes (PII off), then PII on under the same conditions.

    The PII-on run is compared with the PII-off run at `workers` processes, so that count is
    always among the measured ones.
    """
    runs: dict[str, Any] = {}
    for count in sorted({1, workers} if bench.quick else {*SCALING, workers}):
        restart_worker(bench.settings, count)
        bench.say(f"scaling: {len(files)} documents with {count} worker process(es)")
        kb = bench.kb(f"w{count}", "off")
        run = bench.ingest(kb, files)
        raw = bench.raw_model(bench.chunk_texts(kb), count)
        runs[str(count)] = run | {
            "raw_model": raw,
            "ratio_to_raw": round(run["chunks_per_s"] / raw["chunks_per_s"], 3),
        }
    restart_worker(bench.settings, workers)
    bench.say(f"PII on (redact): the same {len(files)} documents, {workers} worker processes")
    kb_on = bench.kb("on", "redact")
    on = bench.ingest(kb_on, files)
    on["per_stage_ms_per_chunk"] = bench.stage_costs(kb_on, on["chunks"])
    off = runs[str(workers)]
    bench.results["scaling"] = runs
    bench.results["pii"] = {
        "pii_on": on,
        "pii_off_same_documents": off,
        "ratio_pii_on_to_off_time": round(on["seconds"] / off["seconds"], 3),
    }

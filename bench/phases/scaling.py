"""A subset of the corpus at 1, 2 and 4 worker processes and on two simulated worker hosts, then
with PII on under the same conditions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.baselines import restart_worker
from bench.session import Bench

SCALING = (1, 2, 4)  # worker processes; a quick run measures 1 and the whole-corpus count only
SUBSET, SUBSET_QUICK = 50, 12  # documents of the scaling and PII runs
HOSTS = 2  # simulated worker hosts of one process each, beside one host of as many processes


def scaling_figures(bench: Bench, files: list[tuple[Path, str]], workers: int) -> None:
    """A subset at 1, 2 and 4 worker processes and on two hosts of one process (PII off), then
    PII on under the same conditions.

    The PII-on run is compared with the PII-off run at `workers` processes, so that count is
    always among the measured ones.
    """
    runs: dict[str, Any] = {}
    for count in sorted({1, workers} if bench.quick else {*SCALING, workers}):
        restart_worker(bench.settings, count)
        bench.say(f"scaling: {len(files)} documents with {count} worker process(es)")
        runs[str(count)] = _run(bench, f"w{count}", files, count)
    restart_worker(bench.settings, 1, hosts=HOSTS)
    bench.say(f"scaling: {len(files)} documents on {HOSTS} worker hosts of 1 process each")
    bench.results["scaling_hosts"] = _run(bench, f"h{HOSTS}", files, HOSTS) | {"hosts": HOSTS}
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


def _run(bench: Bench, name: str, files: list[tuple[Path, str]], processes: int) -> dict[str, Any]:
    """A load of `files` by the running workers, against the raw model in as many processes."""
    kb = bench.kb(name, "off")
    run = bench.ingest(kb, files)
    raw = bench.raw_model(bench.chunk_texts(kb), processes)
    return run | {"raw_model": raw, "ratio_to_raw": round(run["chunks_per_s"] / raw["chunks_per_s"], 3)}

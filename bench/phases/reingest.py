"""Re-ingest: an unchanged load, then an edited tenth while agents poll the documents' status."""

from __future__ import annotations

from pathlib import Path

from bench.pollers import Pollers
from bench.session import Bench, latency_summary


def reingest_figures(bench: Bench, kb: str, files: list[tuple[Path, str]]) -> None:
    """The same files again unchanged, then with every tenth edited while 50 agents poll status."""
    first = bench.results["ingest"]["pii_off"]["seconds"]
    bench.say("re-ingest, unchanged")
    unchanged = bench.ingest(kb, files, cold=False)
    edited = files[::10]
    for path, _ in edited:
        path.write_text(path.read_text() + "\nEdited for the re-ingest benchmark.\n")
    bench.say(f"re-ingest, {len(edited)} of {len(files)} edited, 50 agents polling status")
    doc_ids = [doc_id for _, doc_id in files]
    with Pollers(50, lambda d: bench.remote.get(f"/v1/kbs/{kb}/documents/{d}"), doc_ids) as pollers:
        changed = bench.ingest(kb, files, cold=False)  # the cache is what saves the unchanged chunks
    bench.results["status_polling_ms"] = latency_summary(pollers.latencies_ms) | {
        "pollers": 50,
        "errors": sum(pollers.errors.values()),
        "errors_by_kind": dict(pollers.errors),
    }
    embed = [
        d.get("stats", {}).get("embed", {})
        for d in bench.documents(kb)
        if d["doc_id"] in {e[1] for e in edited}
    ]
    bench.results["reingest"] = {
        "unchanged": unchanged | {"fraction_of_first": round(unchanged["seconds"] / first, 4)},
        "edited": changed
        | {
            "edited_documents": len(edited),
            "fraction_of_first": round(changed["seconds"] / first, 4),
            "chunks_embedded": sum(e.get("embedded", 0) for e in embed),
            "chunks_from_cache": sum(e.get("cached", 0) for e in embed),
        },
    }

"""The Markdown report and plots of a benchmark run: every figure beside its baseline and target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _target(name: str, met: bool, value: str, goal: str) -> str:
    return f"| {name} | {value} | {goal} | {'met' if met else 'NOT met'} |"


def targets(r: dict[str, Any]) -> list[str]:
    ingest, latency, quality, pii = r["ingest"], r["latency_ms"], r["quality"], r["pii"]
    reingest, memory = r["reingest"], r.get("memory", {}).get("worker", {})
    hybrid = max(quality["hybrid_rrf"]["ndcg@10"], quality["hybrid_min_max"]["ndcg@10"])
    best_single = max(quality["keyword"]["ndcg@10"], quality["similarity"]["ndcg@10"])
    growth = memory.get("growth")
    return [
        "| target | measured | goal | |",
        "|---|---|---|---|",
        _target(
            "pipeline / raw model, PII off",
            ingest["ratio_pipeline_to_raw_pii_off"] >= 0.8,
            f"{ingest['ratio_pipeline_to_raw_pii_off']:.2f}",
            ">= 0.8",
        ),
        _target(
            "PII on time / PII off time",
            pii["ratio_pii_on_to_off_time"] <= 2.0,
            f"{pii['ratio_pii_on_to_off_time']:.2f}",
            "<= 2",
        ),
        _target(
            "unchanged re-ingest / first ingest",
            reingest["unchanged"]["fraction_of_first"] < 0.05,
            f"{reingest['unchanged']['fraction_of_first']:.3f}",
            "< 0.05",
        ),
        _target(
            "REST p95 / raw p95 at concurrency 8",
            latency["rest_over_raw_p95_c8"] <= 1.3,
            f"{latency['rest_over_raw_p95_c8']:.2f}",
            "<= 1.3",
        ),
        _target(
            "MCP - REST, median of paired queries at c1, bare JSON-RPC client (what the service adds)",
            latency["mcp_bare_minus_rest_p50_ms"] < 5,
            f"{latency['mcp_bare_minus_rest_p50_ms']:.1f} ms",
            "< 5 ms",
        ),
        _target(
            "MCP - REST, the same with the official SDK client (what an agent on it sees)",
            latency["mcp_minus_rest_p50_ms"] < 5,
            f"{latency['mcp_minus_rest_p50_ms']:.1f} ms (its own check of each result against the "
            f"output schema alone: {latency['mcp_client_schema_check_p50_ms']:.1f} ms)",
            "< 5 ms",
        ),
        _target(
            "hybrid nDCG@10",
            hybrid >= 0.75 and hybrid > best_single,
            f"{hybrid:.3f} (keyword/similarity best {best_single:.3f})",
            ">= 0.75 and above both",
        ),
        *cpu_targets(r["ingest"]),
        *int8_targets(r),
        _target(
            "chunk index bytes a chunk (force-merged)",
            r["index"]["bytes_per_chunk"] <= 8192,
            f"{r['index']['bytes_per_chunk'] / 1024:.1f} KiB",
            "<= 8 KiB",
        ),
        _target(
            "worker RSS last quarter / first",
            growth is not None and abs(growth) <= 0.10,
            f"{growth:+.1%}" if growth is not None else "n/a",
            "within 10%",
        ),
    ]


# The services of the local stack whose CPU, with the worker's, is what ingesting costs; the
# OpenSearch JIT compiler's share is part of "opensearch", reported apart only.
_SERVICES = ("worker", "api", "redis", "opensearch")


def cpu_targets(ingest: dict[str, Any]) -> list[str]:
    """CPU a chunk of the PII-off load against the raw model's own, of the worker and of all the
    services together (issue #25's overhead in CPU, not wall time)."""
    cpu, raw = ingest["pii_off"].get("cpu_ms_per_chunk", {}), ingest["raw_model"].get("cpu_ms_per_chunk")
    if not raw or any(name not in cpu for name in _SERVICES):
        return []
    worker, services = cpu["worker"] / raw, sum(cpu[name] for name in _SERVICES) / raw
    return [
        _target(
            "worker CPU a chunk / raw model's, PII off",
            worker <= 1.10,
            f"{worker:.3f} ({cpu['worker']} / {raw} ms)",
            "<= 1.10",
        ),
        _target(
            "all services' CPU a chunk (worker, API, Redis, OpenSearch) / raw model's",
            services <= 1.25,
            f"{services:.3f} ({sum(cpu[name] for name in _SERVICES):.2f} ms; OpenSearch's JIT "
            f"{cpu.get('opensearch_jit', 0.0)} of it)",
            "<= 1.25",
        ),
    ]


def raw_label(raw: dict[str, Any]) -> str:
    """What the raw model's row stands for."""
    slices = raw.get("slices")
    if not slices:
        return "sample of the same chunk texts"
    return f"sample of the same chunk texts in {len(slices)} slices, chunks/s weighted by each part's chunks"


def shown_seconds(figures: dict[str, Any]) -> Any:
    """A row's seconds, left out for slices weighted by part, whose chunks/s is not their chunks
    over their seconds."""
    return "" if "slices" in figures else figures["seconds"]


def raw_slices(raw: dict[str, Any]) -> str:
    """The raw model's CPU a chunk in each of its slices between the load's parts, where it ran so."""
    slices = raw.get("slices_cpu_ms_per_chunk")
    return f" (by slice between the load's parts: {', '.join(map(str, slices))})" if slices else ""


def int8_targets(r: dict[str, Any]) -> list[str]:
    """The int8 model's pipeline against the raw fp32 model, and its hybrid quality against fp32's."""
    if "int8" not in r:
        return []
    int8 = r["int8"]
    rows = [
        _target(
            "int8 model's pipeline / raw fp32 model, whole corpus, PII off",
            int8["ratio_pipeline_to_raw_fp32"] >= 1.0,
            f"{int8['ratio_pipeline_to_raw_fp32']:.2f} ({int8['ingest']['chunks_per_s']} against "
            f"{r['ingest']['raw_model']['chunks_per_s']} chunks/s)",
            ">= 1",
        )
    ]
    if "ndcg10_minus_fp32" in int8:
        drops = {mode: int8["ndcg10_minus_fp32"][mode] for mode in ("hybrid_rrf", "hybrid_min_max")}
        rows.append(
            _target(
                "int8 model's hybrid nDCG@10 - fp32's (RRF, min-max)",
                min(drops.values()) >= -0.005,
                ", ".join(f"{drop:+.4f}" for drop in drops.values()),
                ">= -0.005",
            )
        )
    return rows


def int8_section(r: dict[str, Any]) -> list[str]:
    """The int8 model beside the fp32 one: loads, raw models and quality, from the same run."""
    if "int8" not in r:
        return []
    int8, ingest = r["int8"], r["ingest"]
    run, raw, raw_fp32, off = int8["ingest"], int8["raw_model"], ingest["raw_model"], ingest["pii_off"]
    loads = f"whole corpus, {{}} KB, {ingest['workers']} worker processes"

    def row(label: str, figures: dict[str, Any], cpu: Any) -> str:
        seconds, per_s = shown_seconds(figures), figures["chunks_per_s"]
        return f"| {label} | {figures['chunks']} | {seconds} | {per_s} | {cpu} |"

    lines = [
        f"## int8 model ({int8['model']})",
        "",
        "| run | chunks | seconds | chunks/s | CPU ms a chunk: model or worker |",
        "|---|---|---|---|---|",
        row(loads.format("fp32"), off, off.get("cpu_ms_per_chunk", {}).get("worker", "")),
        row(loads.format("int8"), run, run["cpu_ms_per_chunk"].get("worker", "")),
        row(f"raw fp32 model, {raw_fp32['processes']} processes", raw_fp32, raw_fp32["cpu_ms_per_chunk"]),
        row(f"raw int8 model, {raw['processes']} processes, the same texts", raw, raw["cpu_ms_per_chunk"]),
        "",
        f"int8 pipeline / raw fp32 model {int8['ratio_pipeline_to_raw_fp32']}; "
        f"int8 pipeline / raw int8 model {int8['ratio_pipeline_to_raw_int8']}; "
        f"raw int8 / raw fp32 {int8['ratio_raw_int8_to_raw_fp32']}. "
        "CPU seconds by service during the int8 load: "
        + ", ".join(f"{k} {v}" for k, v in run["cpu_seconds"].items()),
        "",
    ]
    if "quality" in int8:
        fp32 = r["quality"]
        lines += [
            "| mode | fp32 nDCG@10 | int8 nDCG@10 | int8 - fp32 | int8 MRR@10 | int8 Recall@100 |",
            "|---|---|---|---|---|---|",
        ]
        for mode, value in int8["quality"].items():
            lines.append(
                f"| {mode} | {fp32[mode]['ndcg@10']} | {value['ndcg@10']} | "
                f"{int8['ndcg10_minus_fp32'][mode]:+.4f} | {value['mrr@10']} | {value['recall@100']} |"
            )
        lines += ["", "Keyword search reads no vector: its figures are the fp32 KB's.", ""]
    return lines


def scale_curve(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The scaling runs by label: one worker host of 1, 2, 4 processes, then the simulated hosts."""
    curve = {
        f"{count} worker process{'es' if int(count) > 1 else ''}": run for count, run in r["scaling"].items()
    }
    if "scaling_hosts" in r:
        hosts = r["scaling_hosts"]
        curve[f"{hosts['hosts']} worker hosts of 1 process"] = hosts
    return curve


def _plot(path: Path, title: str, labels: list[str], series: dict[str, list[float]], ylabel: str) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + width * (len(series) - 1) / 2 for x in range(len(labels))], labels)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


PART_NAMES = {
    "stored_fields": "stored fields (`_source`, `_id`)",
    "postings": "postings (BM25 text, keyword terms)",
    "doc_values": "doc values (keys, sorts)",
    "norms": "norms",
    "points": "points (numbers, dates)",
    "vectors_and_graphs": "k-NN vectors and HNSW graphs",
    "segment_info": "field and segment info",
    "other": "other files",
}


def index_parts(index: dict[str, Any]) -> list[str]:
    """The chunk index's bytes a chunk, by part, as a table."""
    lines = [
        f"`{index['index']}`: {index['chunks_in_index']} chunks, force-merged to one segment, "
        f"{index['bytes_per_chunk']} bytes a chunk.",
        "",
        "| part | bytes a chunk |",
        "|---|---|",
    ]
    parts = sorted(index["bytes_per_chunk_by_part"].items(), key=lambda item: -item[1])
    lines += [f"| {PART_NAMES.get(part, part)} | {size} |" for part, size in parts]
    lines += [
        f"| of the k-NN part, the float32 vectors themselves | {index['float32_vector_bytes_per_chunk']} |",
        "",
    ]
    if not index["recovery_sources_dropped"]:
        lines.append(
            "The shards' retention leases had not passed every write before the merge: stored fields "
            "still hold the recovery copy of each `_source` (vectors included)."
        )
    return lines


def scale_note(r: dict[str, Any]) -> list[str]:
    """How the measured figures extrapolate to 10 M chunks, many OpenSearch nodes and N worker hosts."""
    index, ingest = r["index"], r["ingest"]
    per_chunk = index["bytes_per_1000_chunks"] / 1000
    per_process = ingest["pii_off"]["chunks_per_s"] / ingest["workers"]
    vectors_gb = 10_000_000 * 384 * 4 / 2**30
    return [
        f"Measured: {per_chunk / 1024:.1f} KiB of index per chunk (one primary, force-merged; vectors and "
        "graphs, BM25 postings and `_source` without the vectors, with each document's text and mean "
        "vector on its first chunk), so "
        f"10 M chunks take about {per_chunk * 1e7 / 2**30:.0f} GiB per copy, "
        f"{2 * per_chunk * 1e7 / 2**30:.0f} GiB with one replica. The raw float32 vectors alone are "
        f"{vectors_gb:.1f} GiB; Lucene's HNSW graph is searched from the page cache, so the data nodes "
        "together want that much RAM outside the JVM heap to keep k-NN latency flat.",
        "",
        f"Ingest measured {per_process:.1f} chunks/s per worker process here; it is bounded by the model, so "
        f"10 M chunks take about {1e7 / per_process / 3600:.0f} process-hours: N worker hosts of C cores cut "
        "that by N x C until OpenSearch bulk indexing becomes the bound (not measured here: add data nodes "
        "and primaries then).",
        "",
        "Settings that change at that scale (all in `RAGLINE_OPENSEARCH__*` and `RAGLINE_CELERY__*`): "
        "`shards` so that each shard stays at 10-50 GB (about "
        f"{max(1, round(per_chunk * 1e7 / 2**30 / 30))} primaries), `replicas` 1 for availability and read "
        "throughput, `refresh_interval` 30s during bulk loads, `hnsw_m` 16-32 and `hnsw_ef_construction` "
        "128-256 for recall at depth (and `search.candidates` for the k-NN arm), `worker_concurrency` = "
        "cores per host with `embedding.threads` 1, and `bulk_queue_depth` grown with the worker count.",
    ]


def sources_table(sources: dict[str, Any]) -> list[str]:
    """Each source type's first sync and unchanged re-sync of the same documents."""
    lines = [
        f"## Sources: {sources['documents']} documents a type",
        "",
        "| type | first sync (s, submits) | unchanged re-sync (s) | counts of the re-sync |",
        "|---|---|---|---|",
    ]
    for kind in ("folder", "s3", "web", "git"):
        if kind in sources:
            one = sources[kind]
            first, again, counts = one["first_sync_s"], one["unchanged_resync_s"], one["unchanged_counts"]
            lines.append(f"| {kind} | {first} | {again} | {counts} |")
    return [*lines, ""]


def write_report(r: dict[str, Any], path: Path, plots: Path) -> None:
    stamp = r["stamp"]
    ingest, latency, quality, pii = r["ingest"], r["latency_ms"], r["quality"], r["pii"]
    modes = list(quality)
    _plot(
        plots / f"{stamp}-quality.png",
        "manbench nDCG@10: Ragline vs reference",
        modes,
        {
            "Ragline": [quality[m]["ndcg@10"] for m in modes],
            "reference": [quality[m]["reference"]["ndcg@10"] for m in modes],
        },
        "nDCG@10",
    )
    curve = scale_curve(r)
    _plot(
        plots / f"{stamp}-scaling.png",
        "ingest of the subset, PII off: pipeline and raw model in as many processes",
        list(curve),
        {
            "pipeline": [run["chunks_per_s"] for run in curve.values()],
            "raw model": [run["raw_model"]["chunks_per_s"] for run in curve.values()],
        },
        "chunks/s",
    )
    levels = ["c1", "c8", "c32"]
    _plot(
        plots / f"{stamp}-latency.png",
        "hybrid search p95 latency",
        levels,
        {
            "raw embed + _msearch + fetch": [latency[f"raw_{c}"]["p95"] for c in levels],
            "REST /v1/search": [latency[f"rest_{c}"]["p95"] for c in levels],
            "MCP search": [latency[f"mcp_{c}"]["p95"] for c in levels],
        },
        "ms",
    )
    lines = [
        f"# Ragline benchmark {stamp}",
        "",
        f"{r['cpus']} CPUs, {r['memory_gb']} GiB; corpus: {r['corpus']['documents']} manbench pages, "
        f"{r['corpus']['queries']} judged queries; {'quick' if r['quick'] else 'full'} run, "
        f"{r['seconds']} s ("
        + ", ".join(f"{name} {seconds} s" for name, seconds in r.get("phase_seconds", {}).items())
        + ").",
        "",
        *(
            [
                "A quick run checks that every phase works: its figures come from a small sample, and "
                "its retrieval quality, on a few pages with few distractors, is not comparable with the "
                "reference figures (measured on the whole corpus) or with the nDCG target.",
                "",
            ]
            if r["quick"]
            else []
        ),
        "## Targets",
        "",
        *targets(r),
        "",
        "## Ingest (submit -> all ready, through the REST API)",
        "",
        "| run | docs | chunks | seconds | docs/s | chunks/s |",
        "|---|---|---|---|---|---|",
    ]
    off, raw = ingest["pii_off"], ingest["raw_model"]
    lines += [
        f"| whole corpus, PII off, {ingest['workers']} worker processes | {off['documents']} | "
        f"{off['chunks']} | {off['seconds']} | {off['docs_per_s']} | {off['chunks_per_s']} |",
        f"| raw model, {raw['processes']} processes, {raw_label(raw)} | | {raw['chunks']} | "
        f"{shown_seconds(raw)} | | {raw['chunks_per_s']} |",
    ]
    for label, run in scale_curve(r).items():
        lines.append(
            f"| subset, PII off, {label} | {run['documents']} | {run['chunks']} | "
            f"{run['seconds']} | {run['docs_per_s']} | {run['chunks_per_s']} |"
        )
    on = pii["pii_on"]
    lines += [
        f"| subset, PII on (redact), {ingest['workers']} worker processes | "
        f"{on['documents']} | {on['chunks']} | {on['seconds']} | {on['docs_per_s']} | {on['chunks_per_s']} |",
        "",
        "Pipeline over raw model (chunks/s, same number of processes): "
        + ", ".join(f"{label} {run['ratio_to_raw']}" for label, run in scale_curve(r).items())
        + f"; whole corpus {ingest['ratio_pipeline_to_raw_pii_off']}.",
        "",
        f"![scaling]({stamp}-scaling.png)",
        "",
        "Per-stage time per chunk (ms), PII off: "
        + ", ".join(f"{k} {v}" for k, v in off["per_stage_ms_per_chunk"].items()),
        "",
        "CPU seconds by service during the PII-off ingest (what the model shares the cores with; "
        "opensearch_jit is the part of opensearch its JIT compiler took): "
        + ", ".join(f"{k} {v}" for k, v in off.get("cpu_seconds", {}).items()),
        "",
        *(
            [
                "CPU ms per chunk: raw model "
                f"{raw['cpu_ms_per_chunk']}{raw_slices(raw)}; during the ingest "
                + ", ".join(f"{k} {v}" for k, v in off["cpu_ms_per_chunk"].items())
                + _worker_split(off["cpu_ms_per_chunk"])
                + f". The raw model's CPU over the worker's, per chunk: {ingest['cpu_ratio_raw_to_worker']}: "
                "the share of the worker's CPU that is the model's work, and about the throughput "
                "ratio a worker host whose cores the services do not share would reach, its waits "
                "left out. It is not the target's figure.",
                "",
            ]
            if "cpu_ratio_raw_to_worker" in ingest
            else []
        ),
        *(
            [
                f"Before it, a throwaway load of {r['warmup']['documents']} documents warmed up a freshly "
                f"started OpenSearch ({r['warmup']['seconds']} s, {r['warmup']['chunks_per_s']} chunks/s; "
                "CPU seconds: "
                + ", ".join(f"{k} {v}" for k, v in r["warmup"]["cpu_seconds"].items())
                + "); a new JVM compiles its hot paths during its first loads. Then the same pages "
                "went again into new KBs from the embedding cache until OpenSearch's compiler took at "
                f"most {r['warmup'].get('settled_jit_share', 0):.0%} of its CPU in a round; the rounds' "
                "OpenSearch CPU seconds (the compiler's of them): "
                + (
                    ", ".join(
                        f"{w['opensearch_cpu_s']} ({w['opensearch_jit_s']})"
                        for w in r["warmup"].get("warm_rounds", [])
                    )
                    or "none"
                )
                + ".",
                "",
            ]
            if "warmup" in r
            else []
        ),
        "Per-stage time per chunk (ms), PII on: "
        + ", ".join(f"{k} {v}" for k, v in on["per_stage_ms_per_chunk"].items()),
        "",
        "`get_document_status` (REST) while the 10%-edited re-ingest ran, 50 pollers: "
        f"{r['status_polling_ms']}",
        "",
        *int8_section(r),
        "## Re-ingest",
        "",
        "```",
        str(r["reingest"]),
        "```",
        "",
        "## Query latency (ms)",
        "",
        "| path | c | p50 | p95 | p99 |",
        "|---|---|---|---|---|",
    ]
    for key, value in latency.items():
        if isinstance(value, dict):
            path_name, concurrency = key.rsplit("_", 1)
            lines.append(
                f"| {path_name} | {concurrency} | {value['p50']} | {value['p95']} | {value['p99']} |"
            )
    lines += [
        "",
        "The client install's stdio proxy (`ragline mcp --server`) adds "
        f"{latency['mcp_proxy_minus_mcp_p50_ms']} ms at p50 over MCP straight over HTTP (the SDK client "
        "on both paths, paired queries at concurrency 1: its second JSON-RPC hop and stdio).",
        "",
        f"![latency]({stamp}-latency.png)",
        "",
        "## Retrieval quality (manbench)",
        "",
        "| mode | nDCG@10 | MRR@10 | Recall@100 | reference nDCG@10 | reference MRR@10 | reference R@100 |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, value in quality.items():
        ref = value["reference"]
        lines.append(
            f"| {mode} | {value['ndcg@10']} | {value['mrr@10']} | {value['recall@100']} | "
            f"{ref['ndcg@10']} | {ref['mrr@10']} | {ref['recall@100']} |"
        )
    lines += [
        "",
        f"![quality]({stamp}-quality.png)",
        "",
        "## Memory (MB)",
        "",
        "```",
        str(r.get("memory")),
        "```",
        "",
        "## Index size and scale",
        "",
        *index_parts(r["index"]),
        "",
        *scale_note(r),
        "",
        *(sources_table(r["sources"]) if "sources" in r else []),
    ]
    path.write_text("\n".join(lines))


def _worker_split(cpu_ms: dict[str, float]) -> str:
    """The worker's CPU a chunk parted into the model's (from the worker's own metric) and the rest."""
    if "worker_model" not in cpu_ms:
        return ""
    rest = round(cpu_ms["worker"] - cpu_ms["worker_model"], 2)
    return f". Of the worker's, the model's own {cpu_ms['worker_model']} and the rest of the pipeline {rest}"

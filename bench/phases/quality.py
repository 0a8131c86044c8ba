"""Retrieval quality of each search mode on manbench, beside the team's reference figures."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.quality import evaluate, max_pool
from bench.session import Bench

REFERENCE = {  # ../shared/eval/README.md, outside Ragline: whole page truncated to 256 tokens, exact search
    "keyword": {"ndcg@10": 0.551, "mrr@10": 0.489, "recall@100": 0.944},
    "similarity": {"ndcg@10": 0.642, "mrr@10": 0.584, "recall@100": 0.973},
    "hybrid_rrf": {"ndcg@10": 0.683, "mrr@10": 0.621, "recall@100": 0.991},
    "hybrid_min_max": {"ndcg@10": 0.716, "mrr@10": 0.660, "recall@100": 0.990},
}
MODES: dict[str, dict[str, Any]] = {
    "keyword": {"mode": "keyword"},
    "similarity": {"mode": "similarity"},
    "hybrid_rrf": {"mode": "hybrid", "fusion": "rrf"},
    "hybrid_min_max": {"mode": "hybrid", "fusion": "min_max"},
}


def quality_figures(bench: Bench, kb: str, queries: dict[str, str], qrels: dict[str, set[str]]) -> None:
    bench.results["quality"] = mode_figures(bench, kb, queries, qrels, list(MODES))


def mode_figures(
    bench: Bench, kb: str, queries: dict[str, str], qrels: dict[str, set[str]], modes: list[str]
) -> dict[str, Any]:
    """The figures of `modes` on `kb`. Rankings only, so the queries run 4 at a time: the latency
    phase measures speed."""
    figures: dict[str, Any] = {}
    for name in modes:
        params = MODES[name]
        bench.say(f"quality, {name}, {kb}, {len(queries)} queries")

        def ranked(item: tuple[str, str], params: dict[str, Any] = params) -> tuple[str, list[str]]:
            qid, text = item
            body = bench.remote.post(
                "/v1/search", json={"query": text, "kb_ids": [kb], "top_k": 100, **params}
            )
            return qid, max_pool(h["doc_id"] for h in body["results"])

        with ThreadPoolExecutor(max_workers=4) as pool:
            runs = dict(pool.map(ranked, queries.items()))
        figures[name] = evaluate(runs, qrels) | {"reference": REFERENCE[name]}
    return figures

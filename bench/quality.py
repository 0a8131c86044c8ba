"""Retrieval quality on a BEIR-layout benchmark: nDCG@10, MRR@10 and Recall@100, pages max-pooled."""

from __future__ import annotations

import math
from collections.abc import Iterable


def max_pool(hits: Iterable[str]) -> list[str]:
    """Pages in the order of their best chunk (a page's rank is its best chunk's rank)."""
    return list(dict.fromkeys(hits))


def ndcg_at(ranked: list[str], relevant: set[str], k: int = 10) -> float:
    gains = sum(1 / math.log2(i + 2) for i, page in enumerate(ranked[:k]) if page in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(k, len(relevant))))
    return gains / ideal if ideal else 0.0


def mrr_at(ranked: list[str], relevant: set[str], k: int = 10) -> float:
    return next((1 / (i + 1) for i, page in enumerate(ranked[:k]) if page in relevant), 0.0)


def recall_at(ranked: list[str], relevant: set[str], k: int = 100) -> float:
    return len(set(ranked[:k]) & relevant) / len(relevant) if relevant else 0.0


def evaluate(runs: dict[str, list[str]], qrels: dict[str, set[str]]) -> dict[str, float]:
    """Mean metrics over the judged queries; `runs` maps a query id to its ranked pages."""
    judged = [q for q in qrels if q in runs]
    if not judged:
        return {"ndcg@10": 0.0, "mrr@10": 0.0, "recall@100": 0.0, "queries": 0}
    n = len(judged)
    return {
        "ndcg@10": round(sum(ndcg_at(runs[q], qrels[q]) for q in judged) / n, 4),
        "mrr@10": round(sum(mrr_at(runs[q], qrels[q]) for q in judged) / n, 4),
        "recall@100": round(sum(recall_at(runs[q], qrels[q]) for q in judged) / n, 4),
        "queries": n,
    }

"""The benchmark's retrieval metrics."""

from __future__ import annotations

import math

import pytest

from bench.quality import evaluate, max_pool, mrr_at, ndcg_at, recall_at


def test_max_pool_keeps_each_pages_best_rank() -> None:
    assert max_pool(["a", "b", "a", "c", "b"]) == ["a", "b", "c"]


def test_metrics_on_a_hand_computed_ranking() -> None:
    ranked, relevant = ["x", "a", "y", "b"], {"a", "b"}
    assert mrr_at(ranked, relevant) == 0.5
    assert ndcg_at(ranked, relevant) == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    )
    assert recall_at(ranked, relevant, k=2) == 0.5
    assert evaluate({"q": ranked, "other": ["a"]}, {"q": relevant})["queries"] == 1


def test_a_miss_scores_zero() -> None:
    assert evaluate({"q": ["z"]}, {"q": {"a"}}) == {
        "ndcg@10": 0.0,
        "mrr@10": 0.0,
        "recall@100": 0.0,
        "queries": 1,
    }

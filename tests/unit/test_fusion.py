"""Fusion of the keyword and semantic arms."""

from __future__ import annotations

import pytest

from shared.search.fusion import Fusion, fuse, rrf

ARMS = {
    "keyword": [("a", 12.0), ("b", 8.0), ("c", 1.0)],
    "semantic": [("c", 0.95), ("a", 0.90), ("d", 0.10)],
}


def test_rrf_rewards_hits_both_arms_found() -> None:
    scores = rrf(ARMS, {"keyword": 1.0, "semantic": 1.0}, k=60)
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [hit for hit, _ in fuse(ARMS, Fusion.RRF, {}, 60)][:2] == ["a", "c"]


def test_min_max_normalizes_each_arm_and_weights_them() -> None:
    fused = dict(fuse(ARMS, Fusion.MIN_MAX, {"keyword": 0.5, "semantic": 0.5}, 60))
    assert fused["a"] == pytest.approx(0.5 * 1.0 + 0.5 * (0.90 - 0.10) / 0.85)
    assert fused["d"] == pytest.approx(0.0)
    semantic_only = dict(fuse(ARMS, Fusion.MIN_MAX, {"keyword": 0.0, "semantic": 1.0}, 60))
    assert max(semantic_only, key=lambda h: semantic_only[h]) == "c"


def test_z_score_gives_missing_hits_the_arms_floor() -> None:
    fused = dict(fuse(ARMS, Fusion.Z_SCORE, {"keyword": 0.5, "semantic": 0.5}, 60))
    assert set(fused) == {"a", "b", "c", "d"}
    assert fused["a"] > fused["d"]


def test_one_arm_alone_keeps_its_order() -> None:
    only = {"semantic": ARMS["semantic"]}
    for method in Fusion:
        assert [h for h, _ in fuse(only, method, {"semantic": 1.0}, 60)] == ["c", "a", "d"]

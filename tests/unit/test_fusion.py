"""Fusion of the chunk arms, and of the document arms that lift every chunk of a document."""

from __future__ import annotations

import pytest

from shared.search.fusion import Fusion, fuse

ARMS = {
    "keyword": [("a", 12.0), ("b", 8.0), ("c", 1.0)],
    "semantic": [("c", 0.95), ("a", 0.90), ("d", 0.10)],
}
BOTH = {"keyword": 1.0, "semantic": 1.0}


def test_rrf_rewards_hits_both_arms_found() -> None:
    scores = dict(fuse(ARMS, Fusion.RRF, BOTH, 60))
    assert scores["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert scores["d"] == pytest.approx(1 / 63)
    assert [hit for hit, _ in fuse(ARMS, Fusion.RRF, BOTH, 60)][:2] == ["a", "c"]


def test_min_max_normalizes_each_arm_and_weights_them() -> None:
    fused = dict(fuse(ARMS, Fusion.MIN_MAX, {"keyword": 0.5, "semantic": 0.5}, 60))
    assert fused["a"] == pytest.approx(0.5 * 1.0 + 0.5 * (0.90 - 0.10) / 0.85)
    assert fused["d"] == pytest.approx(0.0)
    semantic_only = dict(fuse(ARMS, Fusion.MIN_MAX, {"semantic": 1.0}, 60))
    assert max(semantic_only, key=lambda h: semantic_only[h]) == "c"


def test_z_score_gives_missing_hits_the_arms_floor() -> None:
    fused = dict(fuse(ARMS, Fusion.Z_SCORE, {"keyword": 0.5, "semantic": 0.5}, 60))
    assert set(fused) == {"a", "b", "c", "d"}
    assert fused["a"] > fused["d"]
    # "b" was missed by the semantic arm: it gets that arm's floor, the z-score of "d"
    assert fused["b"] - fused["d"] == pytest.approx(0.5 * 1.0 * (8.0 - 1.0) / _spread(12.0, 8.0, 1.0))


def _spread(*scores: float) -> float:
    mean = sum(scores) / len(scores)
    return float((sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5)


def test_one_arm_alone_keeps_its_order() -> None:
    only = {"semantic": ARMS["semantic"]}
    for method in Fusion:
        assert [h for h, _ in fuse(only, method, {"semantic": 1.0}, 60)] == ["c", "a", "d"]


# Chunks x1, x2 of document X; y1 of Y; z1 of Z. The document arms rank documents through
# their first chunk (x1, y1, z1).
DOCUMENT_OF = {"x1": "X", "x2": "X", "y1": "Y", "z1": "Z"}
CHUNK_ARMS = {"keyword": [("y1", 10.0), ("x2", 9.0), ("z1", 1.0)]}
DOCUMENT_ARMS = {"document_keyword": [("x1", 30.0), ("z1", 20.0), ("y1", 10.0)]}
ALL_ARMS = {**CHUNK_ARMS, **DOCUMENT_ARMS}
EQUAL = {"keyword": 0.5, "document_keyword": 0.5}


@pytest.mark.parametrize("method", list(Fusion))
def test_a_document_arm_lifts_every_chunk_of_its_documents(method: Fusion) -> None:
    weights = EQUAL if method != Fusion.RRF else {"keyword": 1.0, "document_keyword": 1.0}
    fused = dict(fuse(ALL_ARMS, method, weights, 60, DOCUMENT_OF, frozenset({"document_keyword"})))
    # x2 was second among chunks, but its document is the best match as a whole
    assert max(fused, key=lambda h: fused[h]) == "x2"
    # x1, found only through its document, is a candidate with its document's share alone
    assert "x1" in fused
    assert fused["x1"] < fused["x2"]
    chunk_only = dict(fuse(CHUNK_ARMS, method, weights, 60, DOCUMENT_OF, frozenset({"document_keyword"})))
    assert max(chunk_only, key=lambda h: chunk_only[h]) == "y1"


def test_document_shares_add_per_document_not_per_hit() -> None:
    fused = dict(fuse(ALL_ARMS, Fusion.MIN_MAX, EQUAL, 60, DOCUMENT_OF, frozenset({"document_keyword"})))
    assert fused["x1"] == pytest.approx(0.5 * 1.0)
    assert fused["x2"] == pytest.approx(0.5 * (9.0 - 1.0) / 9.0 + 0.5 * 1.0)
    assert fused["z1"] == pytest.approx(0.0 + 0.5 * 0.5)

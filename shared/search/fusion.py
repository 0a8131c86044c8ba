"""Score fusion of the keyword (BM25) and semantic (k-NN) arms: RRF, min-max and z-score."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from enum import StrEnum

Ranked = list[tuple[str, float]]  # (hit id, arm score), best first


class Fusion(StrEnum):
    RRF = "rrf"
    MIN_MAX = "min_max"
    Z_SCORE = "z_score"


def rrf(arms: Mapping[str, Ranked], weights: Mapping[str, float], k: int) -> dict[str, float]:
    """Reciprocal rank fusion: sum of weight / (k + rank) over the arms that found the hit."""
    fused: dict[str, float] = {}
    for arm, ranked in arms.items():
        for rank, (hit, _) in enumerate(ranked, start=1):
            fused[hit] = fused.get(hit, 0.0) + weights.get(arm, 1.0) / (k + rank)
    return fused


def _min_max(ranked: Ranked) -> dict[str, float]:
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    low, high = min(scores), max(scores)
    span = high - low
    return {hit: (score - low) / span if span > 0 else 1.0 for hit, score in ranked}


def _z(ranked: Ranked) -> dict[str, float]:
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    mean = statistics.fmean(scores)
    spread = statistics.pstdev(scores)
    return {hit: (score - mean) / spread if spread > 0 else 0.0 for hit, score in ranked}


def normalized(arms: Mapping[str, Ranked], weights: Mapping[str, float], method: Fusion) -> dict[str, float]:
    """Weighted sum of per-arm normalized scores; a hit an arm missed gets that arm's floor."""
    per_arm = {arm: (_min_max(r) if method == Fusion.MIN_MAX else _z(r)) for arm, r in arms.items()}
    hits = {hit for values in per_arm.values() for hit in values}
    fused: dict[str, float] = {}
    for hit in hits:
        total = 0.0
        for arm, values in per_arm.items():
            floor = 0.0 if method == Fusion.MIN_MAX else min(values.values(), default=0.0)
            total += weights.get(arm, 0.5) * values.get(hit, floor)
        fused[hit] = total
    return fused


def fuse(
    arms: Mapping[str, Ranked], method: Fusion, weights: Mapping[str, float], rrf_k: int
) -> list[tuple[str, float]]:
    """Hits ordered by fused score, best first (ties broken by id for stable output)."""
    scores = rrf(arms, weights, rrf_k) if method == Fusion.RRF else normalized(arms, weights, method)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))

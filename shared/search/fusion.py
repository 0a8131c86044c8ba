"""Score fusion of the search arms: RRF, min-max and z-score.

Chunk arms (BM25 and k-NN over chunks) score hits. Document arms (BM25 over a document's whole
text, k-NN over its mean vector) score documents: a document's share goes to every candidate chunk
of that document, so a chunk of a document that matches as a whole outranks an equally good chunk
of a document that matches only there. Passage-only scoring loses that evidence; the same idea is
Onyx's title-vector share and the parent-document score of hierarchical retrievers.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from enum import StrEnum

Ranked = list[tuple[str, float]]  # (hit id, arm score), best first


class Fusion(StrEnum):
    RRF = "rrf"
    MIN_MAX = "min_max"
    Z_SCORE = "z_score"


def rrf(arms: Mapping[str, Ranked], weights: Mapping[str, float], k: int) -> dict[str, dict[str, float]]:
    """Per arm, weight / (k + rank) of each hit it found."""
    return {
        arm: {hit: weights.get(arm, 0.0) / (k + rank) for rank, (hit, _) in enumerate(ranked, start=1)}
        for arm, ranked in arms.items()
    }


def _min_max(ranked: Ranked) -> dict[str, float]:
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    low, high = min(scores), max(scores)
    span = high - low
    return {hit: (score - low) / span if span > 0 else 1.0 for hit, score in ranked}


def _z(ranked: Ranked) -> dict[str, float]:
    """Z-scores shifted so the arm's lowest hit is 0: a hit the arm missed adds 0, its floor."""
    if not ranked:
        return {}
    scores = [score for _, score in ranked]
    spread = statistics.pstdev(scores)
    low = min(scores)
    return {hit: (score - low) / spread if spread > 0 else 0.0 for hit, score in ranked}


def normalized(
    arms: Mapping[str, Ranked], weights: Mapping[str, float], method: Fusion
) -> dict[str, dict[str, float]]:
    """Per arm, weight × the hit's normalized score; a hit the arm missed gets nothing from it."""
    scale = _min_max if method == Fusion.MIN_MAX else _z
    return {
        arm: {hit: weights.get(arm, 0.0) * value for hit, value in scale(ranked).items()}
        for arm, ranked in arms.items()
    }


def fuse(
    arms: Mapping[str, Ranked],
    method: Fusion,
    weights: Mapping[str, float],
    rrf_k: int,
    document_of: Mapping[str, str] | None = None,
    document_arms: frozenset[str] = frozenset(),
) -> list[tuple[str, float]]:
    """Hits ordered by fused score, best first (ties broken by id for stable output).

    Arms named in `document_arms` rank documents through one representative hit each;
    `document_of` maps every hit to its document, and a document arm's share goes to all of its
    document's hits. Every hit of any arm is a candidate.
    """
    shares = rrf(arms, weights, rrf_k) if method == Fusion.RRF else normalized(arms, weights, method)
    document_of = document_of or {}
    scores: dict[str, float] = {}
    per_document: dict[str, float] = {}
    for arm, values in shares.items():
        for hit, share in values.items():
            if arm in document_arms:
                document = document_of.get(hit, hit)
                per_document[document] = per_document.get(document, 0.0) + share
                scores.setdefault(hit, 0.0)
            else:
                scores[hit] = scores.get(hit, 0.0) + share
    fused = {hit: score + per_document.get(document_of.get(hit, hit), 0.0) for hit, score in scores.items()}
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))

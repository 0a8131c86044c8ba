"""Hybrid search's orchestration: one `_msearch` with BM25 and k-NN arms over chunks and over
documents, fused here. The request models are shared/search/requests.py, the bodies
shared/search/queries.py, the query vectors shared/search/query_embedder.py; the requests go
through the chunk index's owner (shared/search/chunk_index.py) and visibility through the Registry.

The chunk arms rank chunks; the document arms rank whole documents (BM25 over a document's text,
k-NN over its mean vector, both kept on its first chunk) and lift every chunk of the documents
they find (shared/search/fusion.py).

Two phases: the arms return ids, scores and the three keys fusion needs, from doc values; only
the hits that make the answer are then fetched, with their text and highlights. Loading `_source`
for every candidate of every arm (up to 400 per search, each with its vector, first chunks with
their document's text) cost as much as the searches themselves.

Filters (the caller's tenant always among them, added here and never taken from the request)
apply inside every arm. Each KB's chunks may sit in an index of another embedding model
(shared/search/placement.py): the k-NN arms run once per model, with that model's query vector,
on the physical indexes resolved for this search, and the model arms merge by score. Hits of a
document's inactive generation, or of a deleted document, are dropped after a registry lookup, so
readers never see two versions mixed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from opensearchpy import OpenSearch

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.registry import Registry
from shared.search.chunk_index import fetch_hits, rejection, search_arms
from shared.search.fusion import Fusion, fuse
from shared.search.metadata import stored_metadata
from shared.search.placement import RecentPlacements
from shared.search.queries import arm_bodies, fetch_body, filter_clauses
from shared.search.query_embedder import QueryEmbedder
from shared.search.requests import (
    DOCUMENT_ARMS,
    DOCUMENT_KEYWORD,
    DOCUMENT_SEMANTIC,
    KEYWORD,
    SEMANTIC,
    SIMILARITY_ARMS,
    ArmResult,
    Hit,
    Mode,
    SearchRequest,
    SearchResponse,
)
from shared.search.schema import chunks_alias

log = logging.getLogger(__name__)


class Searcher:
    """Runs searches for one deployment."""

    def __init__(self, client: OpenSearch, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.index = chunks_alias(settings)
        self.registry = Registry(client, settings)
        self.embed = QueryEmbedder(settings)
        self.placements = RecentPlacements(client, settings)

    def arm_bodies(
        self, request: SearchRequest, clauses: list[dict[str, Any]], model: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """The `_msearch` bodies of the arms this mode runs (the k-NN arm's vector from `model`)."""
        size = max(self.settings.search.candidates, request.top_k * 3)
        vector = self.embed(request.query, model) if request.mode != Mode.KEYWORD else []
        return arm_bodies(request, clauses, vector, size)

    def search(self, tenant_id: str, kb_ids: list[str], request: SearchRequest) -> SearchResponse:
        started = time.perf_counter()
        if not kb_ids:
            return SearchResponse(results=[], latency_ms=0.0)
        clauses = filter_clauses(tenant_id, kb_ids, request.filters)
        lines: list[dict[str, Any]] = []
        arm_of_line: list[str] = []
        for model, indexes in self._indexes_by_model(tenant_id, kb_ids).items():
            for arm, body in self.arm_bodies(request, clauses, model).items():
                lines += [{"index": ",".join(indexes)}, body]
                arm_of_line.append(arm)
        responses = search_arms(self.client, lines)
        keys: dict[str, _Keys] = {}
        arms: dict[str, list[tuple[str, float]]] = {}
        for arm, response in zip(arm_of_line, responses, strict=True):
            if "error" in response:
                raise arm_failure(response["error"])
            ranked = arms.setdefault(arm, [])
            for hit in response["hits"]["hits"]:
                if arm == SEMANTIC and request.min_score is not None and hit["_score"] < request.min_score:
                    continue
                keys.setdefault(hit["_id"], _keys(hit))
                ranked.append((hit["_id"], float(hit["_score"])))
        # Several models' k-NN arms, or the keyword arm over several indexes: one ranking each.
        arms = {arm: sorted(ranked, key=lambda r: -r[1]) for arm, ranked in arms.items()}
        # Equal weights, as OpenSearch's hybrid normalization does by default.
        equal = 1.0 if request.fusion == Fusion.RRF else 1 / max(len(arms), 1)
        weights = request.weights or dict.fromkeys(arms, equal)
        document_of = {h: k.document for h, k in keys.items()}
        fused = fuse(arms, request.fusion, weights, self.settings.search.rrf_k, document_of, DOCUMENT_ARMS)
        positions = {
            arm: {
                document_of[h] if arm in DOCUMENT_ARMS else h: (rank, score)
                for rank, (h, score) in enumerate(r, start=1)
            }
            for arm, r in arms.items()
        }
        chosen = reported_scores(self._answer(tenant_id, request, fused, keys), request.fusion)
        indexes = sorted({keys[h].index for h, _ in chosen})
        fetched = self._fetch(request, tenant_id, indexes, [h for h, _ in chosen])
        # A hit whose document was deleted or replaced between the phases is gone: it is left out.
        results = [
            _hit(fetched[h]["_source"], score, fetched[h].get("highlight", {}), positions, h, document_of[h])
            for h, score in chosen
            if h in fetched
        ]
        return SearchResponse(results=results, latency_ms=round((time.perf_counter() - started) * 1000, 2))

    def _fetch(
        self, request: SearchRequest, tenant_id: str, indexes: list[str], hit_ids: list[str]
    ) -> dict[str, dict[str, Any]]:
        if not hit_ids:
            return {}
        return fetch_hits(self.client, indexes, fetch_body(request, tenant_id, hit_ids))

    def _indexes_by_model(self, tenant_id: str, kb_ids: list[str]) -> dict[str, list[str]]:
        """The physical indexes holding these KBs, grouped by embedding model.

        Physical names, not aliases: a reembed may swap an alias mid-search, and the index resolved
        here stays until well after the search (placement.py), always paired with its own model.
        """
        grouped: dict[str, set[str]] = {}
        for placement in self.placements([(tenant_id, kb) for kb in kb_ids]).values():
            grouped.setdefault(placement.model, set()).add(placement.index)
        return {model: sorted(indexes) for model, indexes in sorted(grouped.items())}

    def _answer(
        self, tenant_id: str, request: SearchRequest, fused: list[tuple[str, float]], keys: dict[str, _Keys]
    ) -> list[tuple[str, float]]:
        """The best `top_k` fused hits that readers may see, at most `max_per_document` a document.

        Visibility is looked up for the documents of the next few hits in fused order, not for
        every candidate: each lookup costs registry work per document, and most candidates
        never reach the answer. A hidden version (a replaced generation in the moment before it
        is deleted) still counted in its arms' normalization; only its ranking is skipped.
        """
        chosen: list[tuple[str, float]] = []
        per_doc: dict[str, int] = {}
        visible: set[tuple[str, str, int]] = set()
        looked_up: set[tuple[str, str]] = set()
        for position, (hit_id, score) in enumerate(fused):
            hit = keys[hit_id]
            if (hit.kb_id, hit.doc_id) not in looked_up:
                ahead = [keys[h] for h, _ in fused[position : position + 2 * request.top_k]]
                batch = [k for k in ahead if (k.kb_id, k.doc_id) not in looked_up]
                visible |= self._visible(tenant_id, batch)
                looked_up |= {(k.kb_id, k.doc_id) for k in batch}
            if hit.version not in visible:
                continue
            document = hit.document
            if request.max_per_document is not None and per_doc.get(document, 0) >= request.max_per_document:
                continue
            per_doc[document] = per_doc.get(document, 0) + 1
            chosen.append((hit_id, score))
            if len(chosen) == request.top_k:
                break
        return chosen

    def _visible(self, tenant_id: str, hits: list[_Keys]) -> set[tuple[str, str, int]]:
        """(kb, doc, generation) triples that readers may see: each document's active generation."""
        return self.registry.visible_generations(tenant_id, sorted({(h.kb_id, h.doc_id) for h in hits}))


def reported_scores(chosen: list[tuple[str, float]], method: Fusion) -> list[tuple[str, float]]:
    """The answer's hits with the score callers see, which depends on ranks only.

    Min-max and z-score fusion scale raw BM25 scores, whose term statistics are the shared index's:
    reported as such, another tenant's documents would move them. RRF is already rank-based.
    """
    if method == Fusion.RRF:
        return chosen
    reported: list[tuple[str, float]] = []
    place, previous = 0, None
    for hit_id, score in chosen:
        if score != previous:
            place, previous = place + 1, score
        reported.append((hit_id, 1 / place))
    return reported


@dataclass(frozen=True)
class _Keys:
    """What the first phase returns of a hit: where it is and whose version it is."""

    index: str
    kb_id: str
    doc_id: str
    generation: int

    @property
    def version(self) -> tuple[str, str, int]:
        return self.kb_id, self.doc_id, self.generation

    @property
    def document(self) -> str:
        return f"{self.kb_id}/{self.doc_id}"


def _keys(hit: dict[str, Any]) -> _Keys:
    fields = hit["fields"]
    return _Keys(hit["_index"], fields["kb_id"][0], fields["doc_id"][0], int(fields["generation"][0]))


def _hit(
    source: dict[str, Any],
    score: float,
    highlight: dict[str, list[str]],
    positions: dict[str, dict[str, tuple[int, float]]],
    hit_id: str,
    document: str,
) -> Hit:
    arms: dict[str, ArmResult] = {}
    for arm, ranked in positions.items():
        key = document if arm in DOCUMENT_ARMS else hit_id
        if key in ranked:
            rank, arm_score = ranked[key]
            arms[arm] = ArmResult(rank=rank, score=arm_score if arm in SIMILARITY_ARMS else None)
    return Hit(
        text=source["text"],
        score=round(score, 6),
        kb_id=source["kb_id"],
        doc_id=source["doc_id"],
        chunk_idx=source["chunk_idx"],
        title=source.get("title"),
        headings=source.get("headings") or [],
        source_uri=source.get("source_uri"),
        page_num=source.get("page_num"),
        page_label=source.get("page_label"),
        mime_type=source.get("mime_type"),
        metadata=stored_metadata(source),
        highlights=highlight.get("text", []),
        keyword=arms.get(KEYWORD, ArmResult()),
        semantic=arms.get(SEMANTIC, ArmResult()),
        document_keyword=arms.get(DOCUMENT_KEYWORD, ArmResult()),
        document_semantic=arms.get(DOCUMENT_SEMANTIC, ArmResult()),
    )


def arm_failure(error: Any) -> RaglineError:
    """What an arm's failure means to the caller: a query too large for the engine is theirs to
    change (INVALID_ARGUMENT); anything else is the index's, logged by kind for the operator."""
    kinds = [rejection(error), *(rejection(cause) for cause in (error.get("root_cause") or [])[:3])]
    if any("too_many" in kind for kind in kinds):
        return RaglineError(
            "the query has too many terms for the search engine's clause limit: shorten it",
            code=ErrorCode.INVALID_ARGUMENT,
            details={"field": "query"},
        )
    log.warning("a search arm failed: %s", "; ".join(kinds))
    return RaglineError("the search index could not answer", code=ErrorCode.UNAVAILABLE)

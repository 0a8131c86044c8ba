"""Hybrid search: one `_msearch` with BM25 and k-NN arms over chunks and over documents, fused here.

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

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import date, datetime
from enum import StrEnum
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError
from pydantic import BaseModel, Field, field_validator, model_validator

from shared.config import Settings
from shared.embedding import encoder, for_model
from shared.errors import ErrorCode, RaglineError
from shared.models import DocStatus
from shared.registry import doc_key
from shared.search.fusion import Fusion, fuse
from shared.search.metadata import (
    LEGACY_SOURCE,
    SOURCE,
    in_range,
    one_of,
    range_bound,
    stored_metadata,
    valid_key,
)
from shared.search.placement import RecentPlacements
from shared.search.schema import chunks_alias, docs_index

KEYWORD, SEMANTIC = "keyword", "semantic"
DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC = "document_keyword", "document_semantic"
DOCUMENT_ARMS = frozenset({DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC})
SIMILARITY_ARMS = frozenset({SEMANTIC, DOCUMENT_SEMANTIC})
ARMS = (KEYWORD, SEMANTIC, DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC)
_SOURCE_FIELDS = [
    "tenant_id",
    "kb_id",
    "doc_id",
    "generation",
    "chunk_idx",
    "text",
    "title",
    "headings",
    "page_num",
    "page_label",
    "source_uri",
    "filename",
    "mime_type",
    SOURCE,
    LEGACY_SOURCE,
]
_KEY_FIELDS = ["kb_id", "doc_id", "generation"]
_HIGHLIGHT = {"fields": {"text": {"fragment_size": 160, "number_of_fragments": 2}}}
Scalar = str | int | float | bool


class Mode(StrEnum):
    HYBRID = "hybrid"
    SIMILARITY = "similarity"
    KEYWORD = "keyword"


class Range(BaseModel):
    """A numeric or date range: at most one lower and one upper bound, all numbers or all dates.

    A bound is a number or an ISO 8601 date or date-time (without an offset: UTC); a date without
    a time covers its whole day. Checked here, so a bad range is `INVALID_ARGUMENT`, never a
    failed search.
    """

    model_config = {"extra": "forbid"}
    gt: float | datetime | date | None = None
    gte: float | datetime | date | None = None
    lt: float | datetime | date | None = None
    lte: float | datetime | date | None = None

    @model_validator(mode="before")
    @classmethod
    def _typed_bounds(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: range_bound(v) if k in ("gt", "gte", "lt", "lte") else v for k, v in value.items()}

    @model_validator(mode="after")
    def _some_bound(self) -> Range:
        bounds = self.bounds()
        if not bounds:
            raise ValueError("a range needs at least one of gt, gte, lt, lte")
        if {"gt", "gte"} <= set(bounds) or {"lt", "lte"} <= set(bounds):
            raise ValueError("a range takes one lower bound (gt or gte) and one upper (lt or lte)")
        if len({isinstance(b, date) for b in bounds.values()}) > 1:
            raise ValueError("a range's bounds are all numbers or all dates")
        return self

    def bounds(self) -> dict[str, float | date | datetime]:
        given = {"gt": self.gt, "gte": self.gte, "lt": self.lt, "lte": self.lte}
        return {k: v for k, v in given.items() if v is not None}


class Condition(BaseModel):
    """One metadata condition: equality (`eq`), membership (`in`) or a range."""

    model_config = {"extra": "forbid", "populate_by_name": True}
    eq: Scalar | None = None
    in_: list[Scalar] | None = Field(None, alias="in", min_length=1, max_length=1000)
    range: Range | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Condition:
        if sum(v is not None for v in (self.eq, self.in_, self.range)) != 1:
            raise ValueError("give exactly one of eq, in, range")
        return self


# A clause each, within OpenSearch's 1,024 clauses a query (past them the search itself fails).
MAX_METADATA_CONDITIONS = 100


class Filters(BaseModel):
    """Typed filters over chunks and their documents' metadata."""

    model_config = {"extra": "forbid"}
    metadata: dict[str, Scalar | list[Scalar] | Condition] = Field(
        default_factory=dict,
        max_length=MAX_METADATA_CONDITIONS,
        description="Per metadata key: a value, a list (any of), or a condition.",
    )
    mime_types: list[str] = Field(default_factory=list, max_length=50)
    source_prefix: str | None = Field(None, min_length=1, max_length=1000)
    doc_ids: list[str] = Field(default_factory=list, max_length=1000)
    languages: list[str] = Field(default_factory=list, max_length=50)

    @field_validator("metadata")
    @classmethod
    def _keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not valid_key(key) or any(c in key for c in '*?"\\ '):
                raise ValueError(f"invalid metadata key {key!r}")
        return value


class SearchRequest(BaseModel):
    model_config = {"extra": "forbid"}
    query: str = Field(min_length=1, max_length=4000)
    kb_ids: list[str] | None = Field(
        None, max_length=100, description="Default: every KB the caller may read."
    )
    top_k: int = Field(10, ge=1, le=100)
    mode: Mode = Mode.HYBRID
    fusion: Fusion = Fusion.MIN_MAX
    weights: dict[str, float] | None = Field(
        None,
        description=(
            "Hybrid arm weights, keys 'keyword', 'semantic', 'document_keyword', 'document_semantic'; "
            "an arm not named weighs 0. Default: all equal."
        ),
    )
    min_score: float | None = Field(None, ge=0, le=1, description="Similarity mode: lowest k-NN score kept.")
    filters: Filters | None = None
    max_per_document: int | None = Field(None, ge=1, le=100)

    @field_validator("query")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the query is blank")
        return value

    @field_validator("weights")
    @classmethod
    def _weights(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is not None:
            unknown = set(value) - set(ARMS)
            if unknown or any(w < 0 for w in value.values()) or not any(value.values()):
                raise ValueError(f"weights take {', '.join(ARMS)}: non-negative, not all zero")
        return value


class ArmResult(BaseModel):
    """Where a hit ranked in one arm. Only the k-NN arms give a score: a cosine similarity depends
    on the query and the hit alone, while a BM25 score moves with the term statistics of the whole
    shared index, other tenants' documents included."""

    rank: int | None = None
    score: float | None = Field(None, description="k-NN arms: (1 + cosine) / 2. BM25 arms: none.")


class Hit(BaseModel):
    text: str
    score: float = Field(
        description=(
            "Rank-based: with rrf fusion the fused score; with min_max or z_score, 1 / the hit's "
            "place in the fused order (ties share a place)."
        )
    )
    kb_id: str
    doc_id: str
    chunk_idx: int
    title: str | None = None
    headings: list[str] = Field(default_factory=list)
    source_uri: str | None = None
    page_num: int | None = None
    page_label: str | None = None
    mime_type: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    highlights: list[str] = Field(default_factory=list)
    keyword: ArmResult = Field(default_factory=ArmResult)
    semantic: ArmResult = Field(default_factory=ArmResult)
    document_keyword: ArmResult = Field(
        default_factory=ArmResult, description="Where the hit's document ranked in the document BM25 arm."
    )
    document_semantic: ArmResult = Field(
        default_factory=ArmResult, description="Where the hit's document ranked in the document k-NN arm."
    )


class SearchResponse(BaseModel):
    results: list[Hit]
    latency_ms: float


def filter_clauses(tenant_id: str, kb_ids: list[str], filters: Filters | None) -> list[dict[str, Any]]:
    """OpenSearch filter clauses; the tenant clause comes from the caller's identity, always."""
    clauses: list[dict[str, Any]] = [{"term": {"tenant_id": tenant_id}}, {"terms": {"kb_id": kb_ids}}]
    if filters is None:
        return clauses
    for key, spec in filters.metadata.items():
        if isinstance(spec, Condition):
            if spec.eq is not None:
                clauses.append(one_of(key, [spec.eq]))
            elif spec.in_ is not None:
                clauses.append(one_of(key, spec.in_))
            elif spec.range is not None:
                clauses.append(in_range(key, spec.range.bounds()))
        else:
            clauses.append(one_of(key, spec if isinstance(spec, list) else [spec]))
    if filters.mime_types:
        clauses.append({"terms": {"mime_type": filters.mime_types}})
    if filters.source_prefix:
        clauses.append({"prefix": {"source_uri": filters.source_prefix}})
    if filters.doc_ids:
        clauses.append({"terms": {"doc_id": filters.doc_ids}})
    if filters.languages:
        clauses.append({"terms": {"language": filters.languages}})
    return clauses


class QueryEmbedder:
    """Query vectors from the chunks' model, with a small LRU cache (agents repeat queries)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.embedding
        self._size = settings.search.query_cache_size
        self._cache: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, query: str, model: str | None = None) -> list[float]:
        key = (model or self._settings.model, query)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        model_settings = for_model(self._settings, key[0])
        vector = [float(x) for x in encoder(model_settings).encode([query])[0]]
        with self._lock:
            self._cache[key] = vector
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return vector


class Searcher:
    """Runs searches for one deployment."""

    def __init__(self, client: OpenSearch, settings: Settings) -> None:
        self.client = client
        self.settings = settings
        self.index = chunks_alias(settings)
        self.docs = docs_index(settings)
        self.embed = QueryEmbedder(settings)
        self.placements = RecentPlacements(client, settings)

    def arm_bodies(
        self, request: SearchRequest, clauses: list[dict[str, Any]], model: str | None = None
    ) -> dict[str, dict[str, Any]]:
        """The `_msearch` bodies of the arms this mode runs (the k-NN arm's vector from `model`)."""
        size = max(self.settings.search.candidates, request.top_k * 3)
        vector = self.embed(request.query, model) if request.mode != Mode.KEYWORD else []
        keys: dict[str, Any] = {"size": size, "_source": False, "docvalue_fields": _KEY_FIELDS}
        bodies: dict[str, dict[str, Any]] = {}
        if request.mode in (Mode.HYBRID, Mode.KEYWORD):
            words = {"bool": {"filter": clauses, "must": [_keyword_query(request)]}}
            bodies[KEYWORD] = {**keys, "query": words}
        if request.mode in (Mode.HYBRID, Mode.SIMILARITY):
            bodies[SEMANTIC] = {
                **keys,
                "query": {
                    "knn": {
                        "embedding": {"vector": vector, "k": size, "filter": {"bool": {"filter": clauses}}}
                    }
                },
            }
        if request.mode == Mode.HYBRID:
            bodies[DOCUMENT_KEYWORD] = {
                **keys,
                "query": {"bool": {"filter": clauses, "must": [{"match": {"document_text": request.query}}]}},
            }
            bodies[DOCUMENT_SEMANTIC] = {
                **keys,
                "query": {
                    "knn": {
                        "document_embedding": {
                            "vector": vector,
                            "k": size,
                            "filter": {"bool": {"filter": clauses}},
                        }
                    }
                },
            }
        return bodies

    def fetch_body(self, request: SearchRequest, tenant_id: str, hit_ids: list[str]) -> dict[str, Any]:
        """The second phase: the answer's hits by id, with their fields and (not for similarity
        searches, which match no words) the passages of their text that match the query."""
        body: dict[str, Any] = {
            "size": len(hit_ids),
            "_source": _SOURCE_FIELDS,
            "query": {"bool": {"filter": [{"term": {"tenant_id": tenant_id}}, {"ids": {"values": hit_ids}}]}},
        }
        if request.mode != Mode.SIMILARITY:
            body["query"]["bool"]["should"] = [_keyword_query(request)]
            body["highlight"] = _HIGHLIGHT
        return body

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
        responses = self.client.msearch(body=lines)["responses"]
        keys: dict[str, _Keys] = {}
        arms: dict[str, list[tuple[str, float]]] = {}
        for arm, response in zip(arm_of_line, responses, strict=True):
            if "error" in response:
                raise RaglineError("the search index could not answer", code=ErrorCode.UNAVAILABLE)
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
        body = self.fetch_body(request, tenant_id, hit_ids)
        try:
            response = self.client.search(index=",".join(indexes), body=body)
        except TransportError as error:
            raise RaglineError("the search index could not answer", code=ErrorCode.UNAVAILABLE) from error
        return {hit["_id"]: hit for hit in response["hits"]["hits"]}

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
        every candidate: a registry lookup costs about 0.13 ms a document, and most candidates
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
        keys = sorted({(h.kb_id, h.doc_id) for h in hits})
        if not keys:
            return set()
        found = self.client.mget(
            index=self.docs,
            body={"ids": [doc_key(tenant_id, kb, doc) for kb, doc in keys]},
            _source_includes=["kb_id", "doc_id", "status", "active_generation"],
        )
        visible = set()
        for entry in found["docs"]:
            record = entry.get("_source")
            if not record or record["status"] in (DocStatus.DELETING, DocStatus.DELETED):
                continue
            if record.get("active_generation") is not None:
                visible.add((record["kb_id"], record["doc_id"], int(record["active_generation"])))
        return visible


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


def _keyword_query(request: SearchRequest) -> dict[str, Any]:
    return {"multi_match": {"query": request.query, "fields": ["text", "title^0.5", "headings^0.5"]}}


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

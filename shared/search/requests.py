"""The search API's request and response models: what REST and MCP accept and answer.

Validation lives here, so a bad request is `INVALID_ARGUMENT` before any query is built.
"""

from __future__ import annotations

from datetime import date, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from shared.search.fusion import Fusion
from shared.search.metadata import finite_number, range_bound, valid_key

KEYWORD, SEMANTIC = "keyword", "semantic"
DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC = "document_keyword", "document_semantic"
DOCUMENT_ARMS = frozenset({DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC})
SIMILARITY_ARMS = frozenset({SEMANTIC, DOCUMENT_SEMANTIC})
ARMS = (KEYWORD, SEMANTIC, DOCUMENT_KEYWORD, DOCUMENT_SEMANTIC)
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


MAX_FILTER_VALUES = 1000


def _compared(values: list[Scalar]) -> list[Scalar]:
    """Values a filter compares for equality; a number no finite float holds is refused, as in a
    range, instead of matching nothing. A list holds at most `MAX_FILTER_VALUES`, as `in` does: a
    longer one reached OpenSearch, which refuses over 65,536 terms, and answered 503."""
    if len(values) > MAX_FILTER_VALUES:
        raise ValueError(f"a metadata condition lists at most {MAX_FILTER_VALUES} values")
    for value in values:
        if isinstance(value, int | float) and not isinstance(value, bool) and finite_number(value) is None:
            raise ValueError(f"a metadata value is a finite number, not {value!r:.40}")
    return values


class Condition(BaseModel):
    """One metadata condition: equality (`eq`), membership (`in`) or a range."""

    model_config = {"extra": "forbid", "populate_by_name": True}
    eq: Scalar | None = None
    in_: list[Scalar] | None = Field(None, alias="in", min_length=1, max_length=MAX_FILTER_VALUES)
    range: Range | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Condition:
        if sum(v is not None for v in (self.eq, self.in_, self.range)) != 1:
            raise ValueError("give exactly one of eq, in, range")
        _compared([self.eq] if self.eq is not None else self.in_ or [])
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
        for wanted in value.values():
            if not isinstance(wanted, Condition):
                _compared(wanted if isinstance(wanted, list) else [wanted])
        return value


class SearchRequest(BaseModel):
    # No NaN or infinity (Python's JSON reads them): a weight of NaN made every score null.
    model_config = {"extra": "forbid", "allow_inf_nan": False}
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

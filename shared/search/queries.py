"""Query building for hybrid search: filter clauses, the arms' `_msearch` bodies, the fetch body.

Pure: no I/O. The filters (the caller's tenant always among them, from the caller's identity,
never from the request) apply inside every arm. The arms return ids, scores and the keys fusion
needs from doc values; only the answer's hits are fetched with their text and highlights.
"""

from __future__ import annotations

from typing import Any

from shared.search.metadata import LEGACY_SOURCE, SOURCE, in_range, one_of
from shared.search.requests import (
    DOCUMENT_KEYWORD,
    DOCUMENT_SEMANTIC,
    KEYWORD,
    SEMANTIC,
    Condition,
    Filters,
    Mode,
    SearchRequest,
)

SOURCE_FIELDS = [
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
KEY_FIELDS = ["kb_id", "doc_id", "generation"]
# Highlighting reads at most this much of a chunk: OpenSearch refuses the whole search when a
# hit's text is over `index.highlight.max_analyzed_offset`. Today's chunks are far shorter (the
# chunk stage bounds them); a chunk stored before that bound existed may not be.
HIGHLIGHT_MAX_CHARS = 100_000
HIGHLIGHT = {
    "max_analyzer_offset": HIGHLIGHT_MAX_CHARS,
    "fields": {"text": {"fragment_size": 160, "number_of_fragments": 2}},
}


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


def arm_bodies(
    request: SearchRequest, clauses: list[dict[str, Any]], vector: list[float], size: int
) -> dict[str, dict[str, Any]]:
    """The `_msearch` bodies of the arms the request's mode runs, `size` candidates each."""
    keys: dict[str, Any] = {"size": size, "_source": False, "docvalue_fields": KEY_FIELDS}
    bodies: dict[str, dict[str, Any]] = {}
    if request.mode in (Mode.HYBRID, Mode.KEYWORD):
        words = {"bool": {"filter": clauses, "must": [keyword_query(request)]}}
        bodies[KEYWORD] = {**keys, "query": words}
    if request.mode in (Mode.HYBRID, Mode.SIMILARITY):
        bodies[SEMANTIC] = {
            **keys,
            "query": {
                "knn": {"embedding": {"vector": vector, "k": size, "filter": {"bool": {"filter": clauses}}}}
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


def fetch_body(request: SearchRequest, tenant_id: str, hit_ids: list[str]) -> dict[str, Any]:
    """The second phase: the answer's hits by id, with their fields and (not for similarity
    searches, which match no words) the passages of their text that match the query."""
    body: dict[str, Any] = {
        "size": len(hit_ids),
        "_source": SOURCE_FIELDS,
        "query": {"bool": {"filter": [{"term": {"tenant_id": tenant_id}}, {"ids": {"values": hit_ids}}]}},
    }
    if request.mode != Mode.SIMILARITY:
        body["query"]["bool"]["should"] = [keyword_query(request)]
        body["highlight"] = HIGHLIGHT
    return body


def keyword_query(request: SearchRequest) -> dict[str, Any]:
    return {"multi_match": {"query": request.query, "fields": ["text", "title^0.5", "headings^0.5"]}}

"""The search bodies (shared/search/queries.py): which arms each mode runs, and the fetch phase."""

from __future__ import annotations

from shared.search.queries import KEY_FIELDS, SOURCE_FIELDS, arm_bodies, fetch_body, filter_clauses
from shared.search.requests import ARMS, DOCUMENT_SEMANTIC, KEYWORD, SEMANTIC, Mode, SearchRequest


def _clauses() -> list[dict[str, object]]:
    return filter_clauses("t", ["kb"], None)


def test_each_mode_runs_its_arms_with_keys_from_doc_values_only() -> None:
    expected = {Mode.HYBRID: set(ARMS), Mode.KEYWORD: {KEYWORD}, Mode.SIMILARITY: {SEMANTIC}}
    for mode, arms in expected.items():
        bodies = arm_bodies(SearchRequest(query="q", mode=mode), _clauses(), [0.5, 0.5], 30)
        assert set(bodies) == arms
        for body in bodies.values():
            assert body["size"] == 30
            assert body["_source"] is False
            assert body["docvalue_fields"] == KEY_FIELDS


def test_the_knn_arms_filter_inside_the_search_with_the_given_vector() -> None:
    clauses = _clauses()
    bodies = arm_bodies(SearchRequest(query="q"), clauses, [1.0, 0.0], 12)
    knn = bodies[SEMANTIC]["query"]["knn"]["embedding"]
    assert knn == {"vector": [1.0, 0.0], "k": 12, "filter": {"bool": {"filter": clauses}}}
    assert bodies[DOCUMENT_SEMANTIC]["query"]["knn"]["document_embedding"]["filter"] == {
        "bool": {"filter": clauses}
    }
    assert bodies[KEYWORD]["query"]["bool"]["filter"] == clauses


def test_the_fetch_is_tenant_scoped_and_highlights_only_when_words_matched() -> None:
    hybrid = fetch_body(SearchRequest(query="q"), "t", ["a", "b"])
    assert hybrid["size"] == 2
    assert hybrid["_source"] == SOURCE_FIELDS
    assert hybrid["query"]["bool"]["filter"] == [
        {"term": {"tenant_id": "t"}},
        {"ids": {"values": ["a", "b"]}},
    ]
    assert "highlight" in hybrid
    assert "should" in hybrid["query"]["bool"]
    similar = fetch_body(SearchRequest(query="q", mode=Mode.SIMILARITY), "t", ["a"])
    assert "highlight" not in similar
    assert "should" not in similar["query"]["bool"]

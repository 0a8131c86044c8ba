"""Choosing a search's answer from fused hits: visibility looked up a few documents at a time."""

from __future__ import annotations

from shared.search.requests import SearchRequest
from shared.search.searcher import Searcher, _Keys


class _Registry(Searcher):
    """A Searcher whose registry lookup answers from a set, and records what it was asked."""

    def __init__(self, active: set[tuple[str, str, int]]) -> None:
        self.active = active
        self.asked: list[list[str]] = []

    def _visible(self, tenant_id: str, hits: list[_Keys]) -> set[tuple[str, str, int]]:
        self.asked.append(sorted({h.doc_id for h in hits}))
        return {h.version for h in hits} & self.active


def _fused(*hits: tuple[str, str, int]) -> tuple[list[tuple[str, float]], dict[str, _Keys]]:
    keys = {f"{doc}#{gen}#{i}": _Keys("idx", "kb", doc, gen) for i, (_, doc, gen) in enumerate(hits)}
    return [(hit_id, 1.0 - n / 100) for n, hit_id in enumerate(keys)], keys


def test_hidden_versions_are_skipped_and_lookups_stay_near_the_top() -> None:
    hits = [("kb", f"d{n}", 1) for n in range(50)]
    hits.insert(1, ("kb", "d0", 2))  # d0's replaced generation, still in the index for a moment
    fused, keys = _fused(*hits)
    searcher = _Registry({("kb", f"d{n}", 1) for n in range(50)} - {("kb", "d3", 1)} | {("kb", "d0", 2)})
    searcher.active.discard(("kb", "d0", 1))
    chosen = searcher._answer("t", SearchRequest(query="q", top_k=3), fused, keys)
    assert [keys[h].doc_id for h, _ in chosen] == ["d0", "d1", "d2"]
    assert [keys[h].generation for h, _ in chosen] == [2, 1, 1]
    assert searcher.asked == [["d0", "d1", "d2", "d3", "d4"]]  # 6 hits ahead: 5 documents, not 50


def test_lookups_continue_while_hits_are_hidden_and_per_document_caps_hold() -> None:
    hits = [("kb", "gone", 1)] * 10 + [("kb", "a", 1), ("kb", "a", 1), ("kb", "b", 1)]
    fused, keys = _fused(*hits)
    searcher = _Registry({("kb", "a", 1), ("kb", "b", 1)})
    request = SearchRequest(query="q", top_k=2, max_per_document=1)
    chosen = searcher._answer("t", request, fused, keys)
    assert [keys[h].doc_id for h, _ in chosen] == ["a", "b"]
    assert searcher.asked == [["gone"], ["a", "b"]]

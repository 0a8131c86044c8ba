"""What a search tells one tenant about another's documents: nothing that moves with them.

BM25 scores use the term statistics of the whole shared index; a caller who saw raw BM25 scores
could tell whether other tenants' documents hold a term. Responses carry ranks, rank-based fused
scores and k-NN similarities only.
"""

from __future__ import annotations

from typing import Any

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import Ingestor
from shared.models import DocStatus, KnowledgeBase
from shared.registry import Registry
from shared.search.requests import SearchRequest
from shared.search.searcher import Searcher
from tests.integration.helpers import new_kb, wait_terminal

pytestmark = pytest.mark.integration

TERM = "zephyrantheous"


def _ingest(registry: Registry, ingestor: Ingestor, kb: KnowledgeBase, texts: dict[str, str]) -> None:
    for doc_id, text in texts.items():
        ingestor.submit(kb.tenant_id, kb.kb_id, text.encode(), filename=f"{doc_id}.txt", doc_id=doc_id)
    docs = wait_terminal(registry, kb, list(texts))
    assert {d: doc.status for d, doc in docs.items()} == dict.fromkeys(texts, DocStatus.READY)


def _responses(searcher: Searcher, kb: KnowledgeBase) -> list[Any]:
    seen = []
    for body in (
        {"query": TERM, "mode": "keyword"},
        {"query": TERM},
        {"query": f"{TERM} orchard", "fusion": "z_score"},
        {"query": f"{TERM} orchard", "fusion": "rrf"},
    ):
        response = searcher.search(kb.tenant_id, [kb.kb_id], SearchRequest.model_validate(body))
        seen.append([hit.model_dump(exclude={"highlights"}) for hit in response.results])
    return seen


def test_another_tenants_documents_do_not_move_a_tenants_results(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    own, other = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    # Same length each, so the order by term frequency holds whatever the index's average length.
    _ingest(
        registry,
        ingestor,
        own,
        {
            "three": f"{TERM} {TERM} {TERM} grows in the walled orchard by the river.",
            "two": f"{TERM} {TERM} flowers grow in the walled orchard by the river.",
            "one": f"{TERM} and other flowers grow in the walled orchard by the river.",
        },
    )
    searcher = Searcher(opensearch, settings)
    before = _responses(searcher, own)
    assert all(len(hits) == 3 for hits in before)
    assert [h["doc_id"] for h in before[0]] == ["three", "two", "one"]
    _ingest(
        registry,
        ingestor,
        other,
        {
            f"field{i}": f"The {TERM} field notes, part {i}: {TERM} seen again near the shore."
            for i in range(30)
        },
    )
    after = _responses(searcher, own)
    assert after == before
    for hits in after:
        for hit in hits:
            assert hit["keyword"]["score"] is None
            assert hit["document_keyword"]["score"] is None

"""The store stage on the real stack: a huge token does not fail its document, and a rejected chunk
is reported by the kind of the rejection, never by the values it held."""

from __future__ import annotations

import random
import re
import string
import uuid

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.errors import ErrorCode, PermanentError
from shared.ingest import Ingestor
from shared.models import DocStatus
from shared.registry import Registry
from shared.search.chunk_index import bulk_index
from shared.search.requests import SearchRequest
from shared.search.schema import chunks_alias
from shared.search.searcher import Searcher
from tests.integration.helpers import chunks_of, new_kb, wait_terminal

pytestmark = pytest.mark.integration


def test_a_document_with_a_40_kb_token_is_ready_and_searchable_by_its_other_words(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    # First among the chunk's keywords (ties go by the term), as on the audit's document.
    token = "Aa" + "".join(random.Random(40).choices(string.ascii_lowercase, k=40_000))
    text = f"Cormorant nesting survey of the northern cliffs.\n\n{token}\n\nThe cormorants returned in May."
    ingestor.submit(kb.tenant_id, kb.kb_id, text.encode(), filename="survey.txt", doc_id="survey")
    doc = wait_terminal(registry, kb, ["survey"])["survey"]
    assert (doc.status, doc.error) == (DocStatus.READY, None)
    chunks = chunks_of(opensearch, settings, kb, "survey")
    # The token is cut to the chunks' size in characters; its pieces are keywords of their own.
    assert any(len(k) > 1000 and k in token.lower() for c in chunks for k in c["keywords"])
    assert token in "".join(c["text"] for c in chunks)  # whole, in pieces that do not overlap
    searcher = Searcher(opensearch, settings)
    for mode in ("keyword", "hybrid"):
        request = SearchRequest.model_validate({"query": "cormorant nesting", "mode": mode})
        assert [h.doc_id for h in searcher.search(kb.tenant_id, [kb.kb_id], request).results][:1] == [
            "survey"
        ]


def test_a_chunk_too_long_to_highlight_does_not_fail_the_searches_that_find_it(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    # A chunk stored before the chunk stage bounded chunks in characters: one of over a million
    # characters made OpenSearch refuse every search that found it, for want of highlighting.
    kb = new_kb(registry, pii_policy="off")
    ingestor.submit(
        kb.tenant_id, kb.kb_id, b"Heron colony counts by the lake.", filename="h.txt", doc_id="heron"
    )
    assert wait_terminal(registry, kb, ["heron"])["heron"].status == DocStatus.READY
    alias = chunks_alias(settings)
    opensearch.indices.refresh(index=alias)
    filters = [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"doc_id": "heron"}}]
    [stored] = opensearch.search(index=alias, body={"query": {"bool": {"filter": filters}}})["hits"]["hits"]
    long_text = "Heron colony counts by the lake. " + "q" * 1_100_000 + " heron"
    opensearch.update(
        index=stored["_index"], id=stored["_id"], body={"doc": {"text": long_text}}, refresh=True
    )
    searcher = Searcher(opensearch, settings)
    for mode in ("keyword", "hybrid"):
        request = SearchRequest.model_validate({"query": "heron colony", "mode": mode})
        [hit] = searcher.search(kb.tenant_id, [kb.kb_id], request).results
        assert hit.doc_id == "heron"
        assert any("<em>Heron</em>" in h for h in hit.highlights), hit.highlights


def test_a_rejected_chunk_is_reported_without_its_content(opensearch: OpenSearch) -> None:
    index = f"ragline-test-strict-{uuid.uuid4().hex[:8]}"
    mapping = {
        "dynamic": "strict",
        "properties": {"count": {"type": "integer"}, "title": {"type": "keyword"}},
    }
    opensearch.indices.create(index=index, body={"settings": {"number_of_replicas": 0}, "mappings": mapping})
    canary = "canary-4f1e-value"
    try:
        for source in ({"count": canary}, {f"field-{canary}": 1}, {"title": canary * 3000}):
            with pytest.raises(PermanentError) as caught:
                bulk_index(opensearch, index, [("c1", source)])
            assert caught.value.code == ErrorCode.INVALID_ARGUMENT
            # The kind only: OpenSearch's reason quotes the field, the value or the term's bytes.
            assert re.fullmatch(r"a chunk was rejected by the index \([a-z_: ]+\)", caught.value.message)
            assert "canary" not in str(caught.value)
    finally:
        opensearch.indices.delete(index=index, ignore=[404])

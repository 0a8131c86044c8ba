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
    assert any(token.lower() in c["keywords"] for c in chunks_of(opensearch, settings, kb, "survey"))
    searcher = Searcher(opensearch, settings)
    for mode in ("keyword", "hybrid"):
        request = SearchRequest.model_validate({"query": "cormorant nesting", "mode": mode})
        assert [h.doc_id for h in searcher.search(kb.tenant_id, [kb.kb_id], request).results][:1] == [
            "survey"
        ]


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

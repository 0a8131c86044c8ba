"""Caller metadata on the real stack: one tenant's values never break another's ingestion, filters
on strings, numbers and dates work in every arm, and the chunk index's fields do not grow."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import Ingestor
from shared.models import DocStatus, Document, KnowledgeBase, Reembed
from shared.registry import Registry
from shared.search.chunk_index import bulk_index
from shared.search.requests import SearchRequest
from shared.search.schema import chunk_index_body, chunks_alias, chunks_mapping, upgrade_chunk_indexes
from shared.search.searcher import Searcher
from shared.wiring import Services
from tests.integration.helpers import new_kb, wait_terminal
from workers.reembed import reembed
from workers.stages.embed import encode_b64
from workers.stages.store import chunk_doc_id, chunk_source

pytestmark = pytest.mark.integration

MODES = ("keyword", "similarity", "hybrid")


def _submit(ingestor: Ingestor, kb: KnowledgeBase, doc_id: str, text: str, metadata: dict[str, Any]) -> None:
    ingestor.submit(
        kb.tenant_id, kb.kb_id, text.encode(), filename=f"{doc_id}.txt", doc_id=doc_id, metadata=metadata
    )


def _ready(registry: Registry, kb: KnowledgeBase, doc_ids: list[str]) -> None:
    docs = wait_terminal(registry, kb, doc_ids)
    assert {d: (doc.status, doc.error) for d, doc in docs.items()} == dict.fromkeys(
        doc_ids, (DocStatus.READY, None)
    )


def _found(searcher: Searcher, kb: KnowledgeBase, query: str, mode: str, **filters: Any) -> set[str]:
    request = SearchRequest.model_validate(
        {"query": query, "mode": mode, "top_k": 20, "filters": {"metadata": filters}}
    )
    return {hit.doc_id for hit in searcher.search(kb.tenant_id, [kb.kb_id], request).results}


def _field_count(opensearch: OpenSearch, settings: Settings, index: str | None = None) -> int:
    def count(properties: dict[str, Any]) -> int:
        total = 0
        for field in properties.values():
            total += 1 + count(field.get("properties", {})) + len(field.get("fields", {}))
        return total

    mappings = opensearch.indices.get_mapping(index=index or chunks_alias(settings))
    return sum(count(m["mappings"].get("properties", {})) for m in mappings.values())


@pytest.fixture
def fresh_index(opensearch: OpenSearch, settings: Settings) -> Iterator[str]:
    """A chunk index of its own, made as ensure_indexes makes one: the writer's view of a mapping."""
    name = f"ragline-test-meta-{uuid.uuid4().hex[:8]}"
    dimension = settings.embedding.dimension
    opensearch.indices.create(
        index=name, body=chunk_index_body(settings, settings.embedding.model, dimension, {})
    )
    yield name
    opensearch.indices.delete(index=name, ignore=[404])


def _write(
    opensearch: OpenSearch,
    settings: Settings,
    index: str,
    tenant: str,
    metadata: dict[str, Any],
    keywords: list[str] | None = None,
) -> None:
    doc = Document(
        tenant_id=tenant, kb_id="kb", doc_id="d", content_hash="0" * 64, file_size=1, metadata=metadata
    )
    vector = np.ones(settings.embedding.dimension, dtype=np.float32)
    chunk = {
        "chunk_idx": 0,
        "text": "text",
        "headings": [],
        "keywords": keywords or [],
        "embedding_b64": encode_b64(vector),
    }
    bulk_index(opensearch, index, [(tenant, chunk_source(doc, 1, chunk, "title", "en"))])
    opensearch.indices.refresh(index=index)


def test_the_chunk_writer_stores_every_tenants_values_in_fixed_fields(
    opensearch: OpenSearch, settings: Settings, fresh_index: str
) -> None:
    _write(opensearch, settings, fresh_index, "a", {"when": "2021-03-04", "n": 1})
    _write(
        opensearch, settings, fresh_index, "b", {"when": "next tuesday", "n": "one", "deep": {"x": [1, "y"]}}
    )
    fields = _field_count(opensearch, settings, fresh_index)
    _write(opensearch, settings, fresh_index, "c", {f"key{i}": i for i in range(2000)})
    assert _field_count(opensearch, settings, fresh_index) == fields
    assert opensearch.count(index=fresh_index)["count"] == 3


def test_the_chunk_writer_takes_40_kb_keywords_and_source_uris(
    opensearch: OpenSearch, settings: Settings, fresh_index: str
) -> None:
    long = "k" * 40_000
    doc = Document(
        tenant_id="a",
        kb_id="kb",
        doc_id="d",
        content_hash="0" * 64,
        file_size=1,
        source_uri=long,
        filename=long,
    )
    vector = np.ones(settings.embedding.dimension, dtype=np.float32)
    chunk = {
        "chunk_idx": 0,
        "text": f"text {long}",
        "headings": [long],
        "keywords": [long, "text"],
        "page_label": long,
        "embedding_b64": encode_b64(vector),
    }
    bulk_index(opensearch, fresh_index, [("a", chunk_source(doc, 1, chunk, long, long))])
    opensearch.indices.refresh(index=fresh_index)
    assert opensearch.count(index=fresh_index, body={"query": {"term": {"keywords": "text"}}})["count"] == 1


def test_an_index_of_an_earlier_version_is_upgraded_in_place(
    opensearch: OpenSearch, settings: Settings
) -> None:
    """An index whose dynamic `metadata` typed `when` as a date and used up its field limit: after
    the upgrade it takes any value and a 40 KB keyword, and adds no metadata field."""
    name = f"{chunks_alias(settings)}-test-old-{uuid.uuid4().hex[:8]}"
    model, dimension = settings.embedding.model, settings.embedding.dimension
    properties = chunks_mapping(settings, model, dimension)["properties"]
    for field in ("caller_metadata", "metadata_values", "metadata_numbers", "metadata_dates"):
        del properties[field]
    properties["keywords"] = {"type": "keyword"}
    properties["metadata"] = {"type": "object", "dynamic": True, "properties": {"when": {"type": "date"}}}
    body = chunk_index_body(settings, model, dimension, {})
    body["mappings"] = {"dynamic": "strict", "properties": properties}
    opensearch.indices.create(index=name, body=body)
    try:
        full = _field_count(opensearch, settings, name)
        opensearch.indices.put_settings(index=name, body={"index.mapping.total_fields.limit": full})
        upgrade_chunk_indexes(opensearch, settings)
        upgraded = opensearch.indices.get_mapping(index=name)[name]["mappings"]["properties"]
        assert upgraded["metadata"]["dynamic"] == "false"
        limit = opensearch.indices.get_settings(index=name)[name]["settings"]["index"]["mapping"]
        assert int(limit["total_fields"]["limit"]) > full  # room was made for the new fields
        assert {"caller_metadata", "metadata_values", "metadata_numbers", "metadata_dates"} <= set(upgraded)
        fields = _field_count(opensearch, settings, name)
        _write(opensearch, settings, name, "b", {"when": "next tuesday", "new_key": 1}, ["k" * 40_000])
        assert _field_count(opensearch, settings, name) == fields
        upgrade_chunk_indexes(opensearch, settings)  # a second start finds nothing to do
        assert _field_count(opensearch, settings, name) == fields
    finally:
        opensearch.indices.delete(index=name, ignore=[404])


def test_a_key_typed_as_a_date_by_one_tenant_takes_any_value_from_another(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    first, second = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    _submit(ingestor, first, "dated", "The lighthouse keeper logged the storm.", {"when": "2021-03-04"})
    _ready(registry, first, ["dated"])
    _submit(ingestor, second, "vague", "The lighthouse keeper logged the calm.", {"when": "next tuesday"})
    _submit(
        ingestor, second, "other", "The lighthouse keeper logged the fog.", {"when": "2021-03-04T10:00+02:00"}
    )
    _ready(registry, second, ["vague", "other"])
    searcher = Searcher(opensearch, settings)
    query = "lighthouse keeper"
    for mode in MODES:
        march = {"range": {"gte": "2021-03-01", "lte": "2021-03-31"}}
        assert _found(searcher, first, query, mode, when=march) == {"dated"}, mode
        assert _found(searcher, first, query, mode, when={"range": {"gt": "2021-03-04"}}) == set(), mode
        assert _found(searcher, first, query, mode, when="2021-03-04") == {"dated"}, mode
        # A value that is not a date, on a key the other tenant's value looks like a date for.
        assert _found(searcher, first, query, mode, when="next tuesday") == set(), mode
        assert _found(searcher, second, query, mode, when="next tuesday") == {"vague"}, mode
        assert _found(searcher, second, query, mode, when={"in": ["next tuesday", "never"]}) == {"vague"}
        # 08:00 UTC on the 4th: in a range of instants, and not in one that ends before it.
        morning = {"range": {"gte": "2021-03-04T07:30:00Z", "lt": "2021-03-04T08:30:00Z"}}
        assert _found(searcher, second, query, mode, when=morning) == {"other"}, mode
        early = {"range": {"lt": "2021-03-04T08:00:00Z"}}
        assert _found(searcher, second, query, mode, when=early) == set(), mode


def test_two_thousand_keys_of_one_tenant_add_no_fields_while_another_ingests(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    many, other = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    before = _field_count(opensearch, settings)
    tag = uuid.uuid4().hex[:8]
    wide = [f"wide{i}" for i in range(10)]
    for i, doc_id in enumerate(wide):
        keys = {f"k{tag}_{i * 200 + j}": i * 200 + j for j in range(200)}
        _submit(ingestor, many, doc_id, f"Report {i} about tide tables and harbour pilots.", keys)
        _submit(
            ingestor, other, f"plain{i}", f"Note {i} about tide tables.", {"year": 2000 + i, "team": "ops"}
        )
    _ready(registry, many, wide)
    _ready(registry, other, [f"plain{i}" for i in range(10)])
    assert _field_count(opensearch, settings) == before
    searcher = Searcher(opensearch, settings)
    for mode in MODES:
        assert _found(searcher, many, "tide tables", mode, **{f"k{tag}_1999": 1999}) == {"wide9"}, mode
        assert _found(searcher, many, "tide tables", mode, **{f"k{tag}_450": {"range": {"gt": 449.5}}}) == {
            "wide2"
        }, mode
        numbers = {"year": {"range": {"gte": 2003, "lt": 2005}}, "team": "ops"}
        assert _found(searcher, other, "tide tables", mode, **numbers) == {"plain3", "plain4"}, mode
        assert _found(searcher, other, "tide tables", mode, year=[2001, -5, 2009.0]) == {"plain1", "plain9"}


def test_a_reembed_makes_chunks_of_an_earlier_version_filterable(
    services: Services,
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    sender: Celery,
    redis_client: redis.Redis,
) -> None:
    """The upgrade path docs/operations.md gives: chunks written before the typed fields (metadata in
    a dynamic object only) match metadata filters once their KB is reembedded, to its own model."""
    kb = new_kb(registry, pii_policy="off")
    _submit(ingestor, kb, "fresh", "Ferry timetable for the winter season.", {"when": "2021-03-04"})
    _ready(registry, kb, ["fresh"])
    legacy = Document(
        tenant_id=kb.tenant_id,
        kb_id=kb.kb_id,
        doc_id="legacy",
        content_hash="0" * 64,
        file_size=1,
        status=DocStatus.READY,
        active_generation=1,
        metadata={"when": "2021-03-05"},
    )
    registry.create_doc(legacy)
    vector = np.ones(settings.embedding.dimension, dtype=np.float32) / settings.embedding.dimension**0.5
    chunk = {"chunk_idx": 0, "text": "Ferry timetable for the summer season.", "headings": []}
    source = chunk_source(legacy, 1, {**chunk, "embedding_b64": encode_b64(vector)}, "legacy", "en")
    typed = {"caller_metadata", "metadata_values", "metadata_numbers", "metadata_dates"}
    earlier = {**{k: v for k, v in source.items() if k not in typed}, "metadata": legacy.metadata}
    bulk_index(opensearch, chunks_alias(settings), [(chunk_doc_id(legacy, 1, 0), earlier)])
    opensearch.indices.refresh(index=chunks_alias(settings))
    searcher = Searcher(opensearch, settings)
    march = {"range": {"gte": "2021-03-01", "lt": "2021-04-01"}}
    assert _found(searcher, kb, "ferry timetable", "keyword") == {"fresh", "legacy"}
    assert _found(searcher, kb, "ferry timetable", "keyword", when=march) == {"fresh"}
    registry.save_kb(kb.model_copy(update={"reembed": Reembed(model=settings.embedding.model)}))
    reembed(services, kb.tenant_id, kb.kb_id, settings.embedding.model)
    searcher = Searcher(opensearch, settings)  # a new placement cache: the KB moved
    for mode in MODES:
        assert _found(searcher, kb, "ferry timetable", mode, when=march) == {"fresh", "legacy"}, mode
        assert _found(searcher, kb, "ferry timetable", mode, when="2021-03-05") == {"legacy"}, mode

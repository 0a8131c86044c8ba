"""The chunk index layout on the real stack: vectors live only in the vector files, yet every arm
searches them; knowledge bases in an index of the earlier layout keep answering, and a reembed
moves one into the current layout (docs/operations.md#upgrades)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.embedding import Encoder, embedded_text, encoder
from shared.ingest import Ingestor
from shared.models import DocStatus, Document, KnowledgeBase, Reembed
from shared.registry import Registry
from shared.search.chunk_index import bulk_index, merged_parts, refresh
from shared.search.client import build_client
from shared.search.placement import kb_alias, kb_scope, resolve
from shared.search.requests import SearchRequest
from shared.search.schema import (
    VECTOR_FIELDS,
    chunk_index_body,
    chunks_alias,
    chunks_index,
    ensure_indexes,
)
from shared.search.searcher import Searcher
from shared.wiring import build_services
from tests.integration.helpers import chunks_of, new_kb, wait_terminal
from tests.integration.stored_vectors import chunk_filter, mean_direction, stored_cosine
from workers.reembed import reembed
from workers.stages.embed import encode_b64
from workers.stages.store import chunk_doc_id, chunk_source, with_document_fields

pytestmark = pytest.mark.integration

LAGOON = [
    "Mangroves line the lagoon, and their roots shelter young fish from the open sea.",
    "At low tide herons wade across the mud flats to hunt crabs between the roots.",
    "The reef beyond the lagoon breaks the ocean swell before it reaches the shore.",
]


def _search(settings: Settings, kb: KnowledgeBase, query: str, mode: str) -> list[Any]:
    request = SearchRequest.model_validate({"query": query, "mode": mode, "top_k": 10})
    return (
        Searcher(build_client(settings.opensearch), settings)
        .search(kb.tenant_id, [kb.kb_id], request)
        .results
    )


def _answers_in_every_mode(settings: Settings, kb: KnowledgeBase, query: str, doc_id: str) -> None:
    """Keyword, similarity and hybrid search find the document; in hybrid search both document
    arms (its whole text, its mean vector) rank it too."""
    for mode in ("keyword", "similarity", "hybrid"):
        hits = _search(settings, kb, query, mode)
        assert hits, mode
        assert hits[0].doc_id == doc_id, mode
    best = _search(settings, kb, query, "hybrid")[0]
    assert best.document_keyword.rank == 1
    assert best.document_semantic.rank == 1


def _layout(opensearch: OpenSearch, index: str) -> tuple[str | None, list[str], list[bool]]:
    """An index's codec, `_source` excludes, and whether its vector fields have doc values."""
    codec = opensearch.indices.get_settings(index=index)[index]["settings"]["index"].get("codec")
    mapping = opensearch.indices.get_mapping(index=index)[index]["mappings"]
    excludes = mapping.get("_source", {}).get("excludes", [])
    doc_values = [mapping["properties"][field].get("doc_values", True) for field in VECTOR_FIELDS]
    return codec, excludes, doc_values


CURRENT = ("best_compression", VECTOR_FIELDS, [False, False])


@pytest.fixture(scope="module")
def model(settings: Settings) -> Encoder:
    return encoder(settings.embedding)


def _check_vectors(
    opensearch: OpenSearch, index: str, kb: KnowledgeBase, chunks: list[dict[str, Any]], model: Encoder
) -> None:
    """No vector in `_source`; each chunk's vector is its text's encoding, and the document's mean
    vector is on its first chunk only."""
    assert chunks
    assert not any(field in chunk for chunk in chunks for field in VECTOR_FIELDS)
    fresh = model.encode([embedded_text(c) for c in chunks])
    where = [chunk_filter(kb.tenant_id, kb.kb_id, c) for c in chunks]
    for chunk, vector, clauses in zip(chunks, fresh, where, strict=True):
        cosine = stored_cosine(opensearch, index, "embedding", clauses, vector)
        assert (cosine or 0.0) > 0.999, (chunk["chunk_idx"], cosine)
    mean = mean_direction(fresh)
    cosines = [stored_cosine(opensearch, index, "document_embedding", clauses, mean) for clauses in where]
    assert [c["chunk_idx"] for c, cosine in zip(chunks, cosines, strict=True) if cosine is not None] == [0]
    assert (cosines[0] or 0.0) > 0.999
    assert chunks[0]["document_text"] == "\n\n".join(c["text"] for c in chunks)


def test_a_new_knowledge_base_keeps_vectors_only_in_the_vector_files(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings, model: Encoder
) -> None:
    kb = new_kb(registry, pii_policy="off", chunk_size=48, chunk_overlap=8)
    ingestor.submit(kb.tenant_id, kb.kb_id, "\n\n".join(LAGOON).encode(), filename="lagoon.txt")
    assert wait_terminal(registry, kb, ["lagoon.txt"])["lagoon.txt"].status == DocStatus.READY
    index = resolve(opensearch, settings, [(kb.tenant_id, kb.kb_id)])[(kb.tenant_id, kb.kb_id)].index
    assert index == chunks_index(settings, settings.embedding.model)
    assert _layout(opensearch, index) == CURRENT
    chunks = chunks_of(opensearch, settings, kb, "lagoon.txt")
    assert len(chunks) >= 2
    _check_vectors(opensearch, index, kb, chunks, model)
    # The check can fail: another chunk's encoding is not taken for this chunk's vector.
    other = model.encode([embedded_text(chunks[1])])[0]
    first = chunk_filter(kb.tenant_id, kb.kb_id, chunks[0])
    assert (stored_cosine(opensearch, index, "embedding", first, other) or 0.0) < 0.99
    _answers_in_every_mode(settings, kb, "herons hunting crabs on mud flats at low tide", "lagoon.txt")


@pytest.fixture
def own_prefix(settings: Settings) -> Iterator[Settings]:
    """Settings with index names of their own: this test builds a deployment of the earlier layout."""
    prefix = f"ragline-layout-{uuid.uuid4().hex[:8]}"
    opensearch = settings.opensearch.model_copy(update={"index_prefix": prefix})
    yield settings.model_copy(update={"opensearch": opensearch})
    build_client(opensearch).indices.delete(index=f"{prefix}-*", ignore=[404])


def _layout_1_body(settings: Settings, aliases: dict[str, Any]) -> dict[str, Any]:
    """A chunk index as the earlier layout made it: vectors in `_source` and in doc values, and
    stored fields compressed with LZ4."""
    body = chunk_index_body(settings, settings.embedding.model, settings.embedding.dimension, aliases)
    body["settings"]["index"].pop("codec", None)
    body["mappings"].pop("_source", None)
    for field in VECTOR_FIELDS:
        body["mappings"]["properties"][field].pop("doc_values", None)
    return body


def _write_document(
    opensearch: OpenSearch, target: str, registry: Registry, kb: KnowledgeBase, model: Encoder
) -> None:
    """A ready document of three chunks with the model's vectors, written as the store stage does."""
    doc = Document(
        tenant_id=kb.tenant_id,
        kb_id=kb.kb_id,
        doc_id="lagoon.txt",
        content_hash="0" * 64,
        file_size=1,
        status=DocStatus.READY,
        active_generation=1,
    )
    registry.create_doc(doc)
    vectors = model.encode(LAGOON)
    chunks: list[dict[str, Any]] = [
        {"chunk_idx": i, "text": text, "headings": [], "embedding_b64": encode_b64(vector)}
        for i, (text, vector) in enumerate(zip(LAGOON, vectors, strict=True))
    ]
    sources = with_document_fields(
        [(chunk_doc_id(doc, 1, c["chunk_idx"]), chunk_source(doc, 1, c, "lagoon", "en")) for c in chunks]
    )
    bulk_index(opensearch, target, sources)
    refresh(opensearch, target)


def _chunks(opensearch: OpenSearch, index: str, kb: KnowledgeBase) -> list[dict[str, Any]]:
    refresh(opensearch, index)
    body = {"size": 100, "query": kb_scope(kb.tenant_id, kb.kb_id), "sort": [{"chunk_idx": "asc"}]}
    return [hit["_source"] for hit in opensearch.search(index=index, body=body)["hits"]["hits"]]


def test_an_index_of_the_earlier_layout_keeps_answering_and_a_reembed_moves_a_kb_out(
    own_prefix: Settings, model: Encoder
) -> None:
    settings = own_prefix
    services = build_services(settings)
    opensearch, registry = services.client, services.registry
    name = settings.embedding.model
    # A deployment of the earlier layout: its shared index, and two knowledge bases in it, one with
    # its alias and one older than aliases.
    earlier = chunks_index(settings, name, 1)
    opensearch.indices.create(index=earlier, body=_layout_1_body(settings, {chunks_alias(settings): {}}))
    ensure_indexes(opensearch, settings)  # this version starts
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    aliased, bare, fresh = (
        registry.create_kb(KnowledgeBase(tenant_id=tenant, kb_id=kb_id, name=kb_id))
        for kb_id in ("aliased", "bare", "fresh")
    )
    opensearch.indices.update_aliases(
        body={
            "actions": [
                {
                    "add": {
                        "index": earlier,
                        "alias": kb_alias(settings, tenant, "aliased"),
                        "filter": kb_scope(tenant, "aliased"),
                    }
                }
            ]
        }
    )
    _write_document(opensearch, kb_alias(settings, tenant, "aliased"), registry, aliased, model)
    _write_document(opensearch, earlier, registry, bare, model)

    # The current layout's shared index joined the alias as its write index; the earlier one stays.
    current = chunks_index(settings, name)
    assert _layout(opensearch, current) == CURRENT
    assert _layout(opensearch, earlier) == (None, [], [True, True])
    members = opensearch.indices.get_alias(name=chunks_alias(settings))
    assert {
        i: m["aliases"][chunks_alias(settings)].get("is_write_index", False) for i, m in members.items()
    } == {
        earlier: False,
        current: True,
    }
    # A new knowledge base goes to the current layout; the old ones are served where they are.
    placed = resolve(opensearch, settings, [(tenant, "aliased"), (tenant, "bare"), (tenant, "fresh")])
    assert {kb: p.index for (_, kb), p in placed.items()} == {
        "aliased": earlier,
        "bare": earlier,
        "fresh": current,
    }
    _write_document(opensearch, kb_alias(settings, tenant, "fresh"), registry, fresh, model)
    query = "herons hunting crabs on mud flats at low tide"
    for kb in (aliased, bare, fresh):
        _answers_in_every_mode(settings, kb, query, "lagoon.txt")
    assert "embedding" in _chunks(opensearch, earlier, aliased)[0]
    _check_vectors(opensearch, current, fresh, _chunks(opensearch, current, fresh), model)

    # A reembed to the same model moves a knowledge base into an index of the current layout.
    registry.save_kb(aliased.model_copy(update={"reembed": Reembed(model=name)}))
    report = reembed(services, tenant, "aliased", name)
    moved = resolve(opensearch, settings, [(tenant, "aliased")])[(tenant, "aliased")].index
    assert moved == report["index"] != earlier
    assert _layout(opensearch, moved) == CURRENT
    _check_vectors(opensearch, moved, aliased, _chunks(opensearch, moved, aliased), model)
    _answers_in_every_mode(settings, aliased, query, "lagoon.txt")
    assert _chunks(opensearch, earlier, aliased) == []
    _answers_in_every_mode(settings, bare, query, "lagoon.txt")


def test_the_bench_measures_a_merged_index_by_part(own_prefix: Settings, model: Encoder) -> None:
    """The bench's index figure: the parts add up to the segments' bytes, and no vector is left in
    stored fields or doc values, not even in the recovery copy of each `_source`."""
    settings = own_prefix
    services = build_services(settings)
    ensure_indexes(services.client, settings)
    index = chunks_index(settings, settings.embedding.model)
    for kb_id in ("one", "two", "three"):
        kb = services.registry.create_kb(KnowledgeBase(tenant_id="t-bench", kb_id=kb_id, name=kb_id))
        _write_document(services.client, index, services.registry, kb, model)
    merged = merged_parts(services.client, index)
    chunks = 3 * len(LAGOON)
    assert merged["chunks"] == chunks
    assert merged["leases_passed"]
    assert sum(merged["parts"].values()) == merged["bytes"]
    vector = settings.embedding.dimension * 4
    assert merged["float32_vector_bytes"] == (chunks + 3) * vector
    assert merged["parts"]["vectors_and_graphs"] >= merged["float32_vector_bytes"]
    # A vector as a JSON array alone takes about twice its float32 bytes.
    assert merged["parts"]["stored_fields"] < chunks * vector
    assert merged["parts"]["doc_values"] < chunks * vector

"""Helpers of the integration tests: fresh knowledge bases, waiting for documents, reading chunks."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.models import DocStatus, Document, KbSettings, KnowledgeBase
from shared.queue import redis_client
from shared.registry import Registry
from shared.search.schema import chunks_alias
from shared.sources.models import Source, SourceType
from shared.wiring import blob_store


def new_kb(registry: Registry, **kb_settings: object) -> KnowledgeBase:
    """A knowledge base of a fresh tenant, so tests never see each other's documents."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    kb = KnowledgeBase(
        tenant_id=tenant, kb_id="kb", name="test", settings=KbSettings.model_validate(kb_settings)
    )
    return registry.create_kb(kb)


def share_source(kb: KnowledgeBase) -> Source:
    """A folder source of `kb` as a test's engine runs it (over listings of the test's own)."""
    return Source(
        tenant_id=kb.tenant_id,
        kb_id=kb.kb_id,
        source_id="share",
        type=SourceType.FOLDER,
        settings={"path": "/share"},
    )


def orphan(
    registry: Registry, settings: Settings, kb: KnowledgeBase, doc_id: str, data: bytes, **state: Any
) -> None:
    """A registry record in `state` with its bytes stored and no task anywhere, as a fault leaves it."""
    blob = blob_store(settings, redis_client(settings)).put(data)
    registry.create_doc(
        Document(
            tenant_id=kb.tenant_id,
            kb_id=kb.kb_id,
            doc_id=doc_id,
            content_hash=blob.sha256,
            file_size=blob.size,
            filename=doc_id,
            **state,
        )
    )


def wait_terminal(
    registry: Registry, kb: KnowledgeBase, doc_ids: list[str], timeout_s: float = 300
) -> dict[str, Document]:
    """Poll the registry until every document is ready or failed; fail the test on timeout."""
    deadline = time.monotonic() + timeout_s
    docs: dict[str, Document] = {}
    while time.monotonic() < deadline:
        docs = {d: registry.require_doc(kb.tenant_id, kb.kb_id, d).doc for d in doc_ids}
        if all(doc.status in (DocStatus.READY, DocStatus.FAILED) for doc in docs.values()):
            return docs
        time.sleep(0.5)
    pending = {d: doc.status.value for d, doc in docs.items() if not doc.status.terminal}
    pytest.fail(f"documents not terminal after {timeout_s}s: {pending}")


def chunks_of(
    opensearch: OpenSearch, settings: Settings, kb: KnowledgeBase, doc_id: str | None = None
) -> list[dict[str, Any]]:
    filters: list[dict[str, Any]] = [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"kb_id": kb.kb_id}}]
    if doc_id is not None:
        filters.append({"term": {"doc_id": doc_id}})
    opensearch.indices.refresh(index=chunks_alias(settings))
    response = opensearch.search(
        index=chunks_alias(settings),
        body={"size": 1000, "query": {"bool": {"filter": filters}}, "sort": [{"chunk_idx": "asc"}]},
    )
    return [hit["_source"] for hit in response["hits"]["hits"]]


def mismatched_chunk_sets(
    opensearch: OpenSearch, settings: Settings, kb: tuple[str | None, str], expected: dict[str, int]
) -> list[str]:
    """Documents whose indexed chunks are not exactly one set of `expected[doc_id]` chunks.

    A duplicate delivery, a half-written retry or a leftover old generation all show up here;
    so does a ready document missing from the index, or an indexed one that is not expected.
    `kb` is (tenant, kb id); a test that knows only a unique KB id passes no tenant.
    """
    tenant_id, kb_id = kb
    scope: list[dict[str, Any]] = [{"term": {"kb_id": kb_id}}]
    if tenant_id is not None:
        scope.append({"term": {"tenant_id": tenant_id}})
    index = chunks_alias(settings)
    opensearch.indices.refresh(index=index)
    response = opensearch.search(
        index=index,
        body={
            "size": 0,
            "query": {"bool": {"filter": scope}},
            "aggs": {
                "docs": {
                    "terms": {"field": "doc_id", "size": 10_000},
                    "aggs": {
                        "generations": {"cardinality": {"field": "generation"}},
                        "chunks": {"cardinality": {"field": "chunk_idx"}},
                    },
                }
            },
        },
    )
    buckets = {b["key"]: b for b in response["aggregations"]["docs"]["buckets"]}
    wrong = [
        doc_id
        for doc_id, b in buckets.items()
        if doc_id not in expected
        or b["doc_count"] != expected[doc_id]
        or b["generations"]["value"] != 1
        or b["chunks"]["value"] != b["doc_count"]
    ]
    return sorted(wrong + [doc_id for doc_id in expected if doc_id not in buckets])

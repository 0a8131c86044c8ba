"""Operations on the chunk index that both services and workers need."""

from __future__ import annotations

from typing import Any

from opensearchpy import OpenSearch


def doc_filter(tenant_id: str, kb_id: str, doc_id: str) -> list[dict[str, Any]]:
    return [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}, {"term": {"doc_id": doc_id}}]


def delete_generations(
    client: OpenSearch, index: str, tenant_id: str, kb_id: str, doc_id: str, keep: int | None
) -> int:
    """Delete a document's chunks of every generation but `keep` (all when None); returns the count."""
    query: dict[str, Any] = {"bool": {"filter": doc_filter(tenant_id, kb_id, doc_id)}}
    if keep is not None:
        query["bool"]["must_not"] = [{"term": {"generation": keep}}]
    result = client.delete_by_query(index=index, body={"query": query}, refresh=True, conflicts="proceed")
    return int(result.get("deleted", 0))

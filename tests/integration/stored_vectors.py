"""What a chunk index holds of a vector, read back through k-NN search.

Chunk indexes keep vectors out of `_source` and out of doc values (shared/search/schema.py), so a
test cannot read them as fields; it asks the search that uses them instead. A k-NN query whose
filter leaves one candidate scores it exactly: Lucene's cosine score is (1 + cos) / 2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from opensearchpy import OpenSearch


def chunk_filter(tenant_id: str, kb_id: str, chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """Filter clauses that select exactly this chunk (one version of one document)."""
    return [
        {"term": {"tenant_id": tenant_id}},
        {"term": {"kb_id": kb_id}},
        {"term": {"doc_id": chunk["doc_id"]}},
        {"term": {"generation": chunk["generation"]}},
        {"term": {"chunk_idx": chunk["chunk_idx"]}},
    ]


def stored_cosine(
    opensearch: OpenSearch, index: str, field: str, where: list[dict[str, Any]], vector: Sequence[float]
) -> float | None:
    """The cosine between `vector` and the `field` vector of the one chunk `where` selects; None
    when that chunk has no vector in `field`."""
    query = {field: {"vector": [float(x) for x in vector], "k": 1, "filter": {"bool": {"filter": where}}}}
    hits = opensearch.search(index=index, body={"size": 2, "_source": False, "query": {"knn": query}})
    found = hits["hits"]["hits"]
    assert len(found) <= 1, f"the filter selects {len(found)} chunks"
    return 2 * float(found[0]["_score"]) - 1 if found else None


def mean_direction(vectors: Sequence[Sequence[float]] | np.ndarray[Any, Any]) -> list[float]:
    """The normalized mean of `vectors`, as the store stage computes a document's vector."""
    mean = np.mean(np.asarray(vectors, dtype=np.float64), axis=0)
    return list(mean / np.linalg.norm(mean))

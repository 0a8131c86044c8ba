"""The OpenSearch the project started has the k-NN plugin and serves BM25, k-NN and filtered k-NN."""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from opensearchpy import OpenSearch

pytestmark = pytest.mark.integration

DIM = 384
TOPICS = ["alpha", "beta", "gamma"]


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector]


def _cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _docs() -> list[dict[str, Any]]:
    rng = random.Random(384)
    docs = []
    for i in range(30):
        docs.append(
            {
                "doc_id": f"d{i}",
                "topic": TOPICS[i % 3],
                "text": f"document number {i} about {TOPICS[i % 3]} "
                + ("the quick brown fox jumps" if i == 7 else "lorem ipsum dolor"),
                # Vectors are deliberately not normalized: cosine similarity must ignore the length.
                "embedding": [rng.gauss(0, 1) * (1 + i % 4) for _ in range(DIM)],
            }
        )
    return docs


@pytest.fixture(scope="module")
def index(opensearch: OpenSearch) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    name = f"ragline-test-knn-{uuid.uuid4().hex[:8]}"
    opensearch.indices.create(
        index=name,
        body={
            "settings": {"index": {"knn": True, "number_of_shards": 1, "number_of_replicas": 0}},
            "mappings": {
                "properties": {
                    "doc_id": {"type": "keyword"},
                    "topic": {"type": "keyword"},
                    "text": {"type": "text", "analyzer": "english"},
                    "embedding": {
                        "type": "knn_vector",
                        "dimension": DIM,
                        "method": {
                            "name": "hnsw",
                            "engine": "lucene",
                            "space_type": "cosinesimil",
                            "parameters": {"m": 16, "ef_construction": 128},
                        },
                    },
                }
            },
        },
    )
    docs = _docs()
    body: list[dict[str, Any]] = []
    for doc in docs:
        body += [{"index": {"_index": name, "_id": doc["doc_id"]}}, doc]
    response = opensearch.bulk(body=body, refresh=True)
    assert response["errors"] is False
    yield name, docs
    opensearch.indices.delete(index=name)


def test_knn_plugin_is_installed(opensearch: OpenSearch) -> None:
    plugins = opensearch.cat.plugins(format="json")
    assert "opensearch-knn" in {plugin["component"] for plugin in plugins}
    version = opensearch.info()["version"]
    assert version["distribution"] == "opensearch"
    print(f"OpenSearch {version['number']} with k-NN plugin")


def test_mapping_is_a_lucene_hnsw_cosine_vector(opensearch: OpenSearch, index: tuple[str, Any]) -> None:
    name, _ = index
    field = opensearch.indices.get_mapping(index=name)[name]["mappings"]["properties"]["embedding"]
    assert field["type"] == "knn_vector"
    assert field["dimension"] == DIM
    assert field["method"]["engine"] == "lucene"
    assert field["method"]["space_type"] == "cosinesimil"


def test_knn_returns_the_nearest_documents_by_cosine(opensearch: OpenSearch, index: tuple[str, Any]) -> None:
    name, docs = index
    rng = random.Random(7)
    target = docs[11]["embedding"]
    query = [x + rng.gauss(0, 0.8) for x in target]
    expected = sorted(docs, key=lambda d: _cosine(_unit(query), _unit(d["embedding"])), reverse=True)
    response = opensearch.search(
        index=name, body={"size": 5, "query": {"knn": {"embedding": {"vector": query, "k": 5}}}}
    )
    hits = response["hits"]["hits"]
    assert [hit["_id"] for hit in hits] == [doc["doc_id"] for doc in expected[:5]]
    # Lucene's cosine score is (1 + cos) / 2.
    best_cos = _cosine(_unit(query), _unit(expected[0]["embedding"]))
    assert hits[0]["_score"] == pytest.approx((1 + best_cos) / 2, rel=1e-4)


def test_filtered_knn_honours_its_filter(opensearch: OpenSearch, index: tuple[str, Any]) -> None:
    name, docs = index
    query = docs[11]["embedding"]  # doc 11 is topic "gamma"
    response = opensearch.search(
        index=name,
        body={
            "size": 10,
            "query": {
                "knn": {"embedding": {"vector": query, "k": 10, "filter": {"term": {"topic": "alpha"}}}}
            },
        },
    )
    hits = response["hits"]["hits"]
    alpha = [doc for doc in docs if doc["topic"] == "alpha"]
    assert len(hits) == len(alpha)
    assert {hit["_source"]["topic"] for hit in hits} == {"alpha"}
    expected = sorted(alpha, key=lambda d: _cosine(_unit(query), _unit(d["embedding"])), reverse=True)
    assert [hit["_id"] for hit in hits] == [doc["doc_id"] for doc in expected]


def test_bm25_query_finds_the_matching_text(opensearch: OpenSearch, index: tuple[str, Any]) -> None:
    name, _ = index
    response = opensearch.search(index=name, body={"query": {"match": {"text": "jumping foxes"}}})
    hits = response["hits"]["hits"]
    assert [hit["_id"] for hit in hits] == ["d7"]  # the english analyzer stems jumping/jumps, foxes/fox


def test_msearch_runs_both_arms_in_one_request(opensearch: OpenSearch, index: tuple[str, Any]) -> None:
    name, docs = index
    body = [
        {"index": name},
        {"size": 3, "query": {"match": {"text": "quick fox"}}},
        {"index": name},
        {"size": 3, "query": {"knn": {"embedding": {"vector": docs[3]["embedding"], "k": 3}}}},
    ]
    responses = opensearch.msearch(body=body)["responses"]
    assert responses[0]["hits"]["hits"][0]["_id"] == "d7"
    assert responses[1]["hits"]["hits"][0]["_id"] == "d3"

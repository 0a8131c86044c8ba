"""The report's chunk index section: bytes a chunk by part, largest first, and the size target."""

from __future__ import annotations

from typing import Any

from bench.report import index_parts


def _index(dropped: bool) -> dict[str, Any]:
    return {
        "index": "ragline-chunks-all-minilm-l6-v2-v2",
        "chunks_in_index": 10682,
        "bytes_per_chunk": 2501,
        "bytes_per_chunk_by_part": {"stored_fields": 395, "postings": 307, "vectors_and_graphs": 1729},
        "float32_vector_bytes_per_chunk": 1695,
        "recovery_sources_dropped": dropped,
    }


def test_parts_are_listed_largest_first_with_the_vectors_own_share() -> None:
    lines = index_parts(_index(dropped=True))
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| part")]
    assert rows == [
        "| k-NN vectors and HNSW graphs | 1729 |",
        "| stored fields (`_source`, `_id`) | 395 |",
        "| postings (BM25 text, keyword terms) | 307 |",
        "| of the k-NN part, the float32 vectors themselves | 1695 |",
    ]
    assert not any("retention leases" in line for line in lines)


def test_a_merge_before_the_leases_passed_is_said() -> None:
    assert any("retention leases" in line for line in index_parts(_index(dropped=False)))

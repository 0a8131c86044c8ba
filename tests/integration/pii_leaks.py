"""Where a raw value could be left: every Ragline index, and every byte of the blob store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch

from shared.config import Settings

_VECTORS = ["embedding", "document_embedding"]


def index_leaks(opensearch: OpenSearch, settings: Settings, tenant_id: str, values: list[str]) -> list[str]:
    """`value (how)` for each value found in any `<prefix>-*` index: the registry of documents and
    of knowledge bases, and every chunk index. Searched on every field (phrase and query string,
    across all tenants) and in the raw `_source` of every record of the tenant."""
    pattern = f"{settings.opensearch.index_prefix}-*"
    opensearch.indices.refresh(index=pattern)
    leaks: list[str] = []
    for value in values:
        for how, clause in _lookups(value).items():
            body = {"query": clause, "size": 1}
            if opensearch.search(index=pattern, body=body)["hits"]["total"]["value"]:
                leaks.append(f"{value} ({how})")
    sources = json.dumps(_sources(opensearch, pattern, tenant_id), ensure_ascii=False)
    leaks += [f"{value} (_source)" for value in values if value in sources]
    return leaks


def _lookups(value: str) -> dict[str, dict[str, Any]]:
    return {
        "phrase, every field": {"multi_match": {"query": value, "type": "phrase", "fields": ["*"]}},
        "query_string, every field": {"query_string": {"query": f'"{value}"', "fields": ["*"]}},
    }


def _sources(opensearch: OpenSearch, pattern: str, tenant_id: str) -> list[dict[str, Any]]:
    body = {
        "size": 10_000,
        "query": {"term": {"tenant_id": tenant_id}},
        "_source": {"excludes": _VECTORS},
    }
    return [hit["_source"] for hit in opensearch.search(index=pattern, body=body)["hits"]["hits"]]


def blob_store_leaks(settings: Settings, values: list[str]) -> list[str]:
    """`value (file)` for each value found in any file under the blob store (blobs, artifacts,
    temporary files), as UTF-8 bytes."""
    root = settings.state_dir / "blobstore"
    wanted = {value: value.encode() for value in values}
    leaks: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = _read(path)
        leaks += [f"{value} ({path.relative_to(root)})" for value, raw in wanted.items() if raw in data]
    return leaks


def blob_store_files(settings: Settings) -> set[Path]:
    return {p for p in (settings.state_dir / "blobstore").rglob("*") if p.is_file()}


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # removed meanwhile by another test's worker
        return b""

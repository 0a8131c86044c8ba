"""Where a raw value could be left: every Ragline index, and every byte of the blob store (its
directory, or its bucket when it is S3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from opensearchpy import OpenSearch

from shared import s3
from shared.blob_s3 import endpoint_of
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
    """`value (name)` for each value found in anything the blob store holds (blobs, artifacts,
    temporary files), as UTF-8 bytes: every file under its directory, or every object under its
    bucket's prefix when it is S3 (the local copies a parse reads lie in the scratch directory)."""
    wanted = {value: value.encode() for value in values}
    leaks: list[str] = []
    for name, data in _stored(settings):
        leaks += [f"{value} ({name})" for value, raw in wanted.items() if raw in data]
    return leaks


def _stored(settings: Settings) -> Iterator[tuple[str, bytes]]:
    """Each stored thing with its name in the store (`blobs/...`, `artifacts/...`, `tmp/...`), and
    each local copy of a blob (`scratch/...`)."""
    roots = {"": settings.state_dir / "blobstore", "scratch/": settings.state_dir / "blob-scratch"}
    for label, root in roots.items():
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            yield f"{label}{path.relative_to(root)}", _read(path)
    if settings.blobs.url is not None:
        client = s3.make_client(endpoint_of(settings.blobs))
        bucket, prefix = settings.blobs.bucket, settings.blobs.prefix
        for item in s3.list_objects(client, bucket, prefix, "the test's blob store"):
            try:
                data = s3.read_object(client, bucket, item.key, "the test's blob store")
            except FileNotFoundError:  # removed meanwhile by another test's worker
                continue
            yield item.key.removeprefix(prefix), data


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:  # removed meanwhile by another test's worker
        return b""

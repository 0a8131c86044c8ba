"""Index names and mappings: knowledge bases, the document registry and the chunk index."""

from __future__ import annotations

import re
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import RequestError

from shared.config import Settings
from shared.search import metadata

# Lucene refuses a term over 32,766 bytes, and with it the whole document: a keyword field that
# can carry caller or content data leaves longer values out of its index (they stay in `_source`).
# `ignore_above` counts characters, and a character takes at most 4 bytes.
KEYWORD_CHARS = 8191


def _keyword() -> dict[str, Any]:
    return {"type": "keyword", "ignore_above": KEYWORD_CHARS}


def kbs_index(settings: Settings) -> str:
    return f"{settings.opensearch.index_prefix}-kbs"


def docs_index(settings: Settings) -> str:
    return f"{settings.opensearch.index_prefix}-docs"


def chunks_alias(settings: Settings) -> str:
    """The alias searches and writes go through; it points at one physical chunk index."""
    return f"{settings.opensearch.index_prefix}-chunks"


# The chunk index layout new indexes get. Layout 2 keeps vectors out of `_source` and out of doc
# values (the vector files hold them; only the k-NN arms read them) and compresses stored fields
# with DEFLATE. Neither `_source` nor the codec can change on a live index, so the shared index of
# a model is a new index per layout: `ensure_indexes` creates it beside the earlier one, which
# keeps serving the knowledge bases already in it.
LAYOUT = 2
VECTOR_FIELDS = ["embedding", "document_embedding"]


def chunks_index(settings: Settings, model: str, version: int = LAYOUT) -> str:
    """The shared chunk index of `model`: the one of the current layout unless `version` says."""
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"{chunks_alias(settings)}-{slug}-v{version}"


def _small_index_settings(settings: Settings) -> dict[str, Any]:
    return {
        "number_of_shards": 1,
        "number_of_replicas": settings.opensearch.replicas,
        "refresh_interval": "1s",
    }


KBS_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        "tenant_id": {"type": "keyword"},
        "kb_id": {"type": "keyword"},
        "name": {"type": "text", "fields": {"raw": _keyword()}},
        "description": {"type": "text"},
        "tags": _keyword(),
        "settings": {"type": "object", "enabled": False},
        "embedding_model": {"type": "keyword"},
        "embedding_dimension": {"type": "integer"},
        "reembed": {"type": "object", "enabled": False},
        "reembed_error": {"type": "text", "index": False},
        "created_at": {"type": "date"},
        "updated_at": {"type": "date"},
    },
}

DOCS_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        "tenant_id": {"type": "keyword"},
        "kb_id": {"type": "keyword"},
        "doc_id": {"type": "keyword"},
        "status": {"type": "keyword"},
        "stage": {"type": "keyword"},
        "progress": {"type": "float"},
        "attempts": {"type": "integer"},
        "error": {
            "properties": {
                "code": {"type": "keyword"},
                "stage": {"type": "keyword"},
                "message": {"type": "text"},
                "retryable": {"type": "boolean"},
            }
        },
        "content_hash": {"type": "keyword"},
        "content_version": {"type": "integer"},
        "active_generation": {"type": "integer"},
        "file_size": {"type": "long"},
        "mime_type": _keyword(),
        "filename": _keyword(),
        "source_uri": _keyword(),
        "source_id": {"type": "keyword"},
        "url": _keyword(),
        "fetch": {"type": "object", "enabled": False},
        "outcome": {"type": "keyword"},
        "title": {"type": "text"},
        # Caller metadata is kept verbatim; chunks carry a searchable copy.
        "metadata": {"type": "object", "enabled": False},
        "chunk_count": {"type": "integer"},
        "pii": {"type": "object", "enabled": False},
        "trace": {"type": "object", "enabled": False},
        "timings": {"type": "object", "enabled": False},
        "stats": {"type": "object", "enabled": False},
        "transitions": {"type": "object", "enabled": False},
        "queue": {"type": "keyword"},
        "batch_id": {"type": "keyword"},
        "claimed_by": {"type": "keyword"},
        "lease_until": {"type": "date"},
        "created_at": {"type": "date"},
        "updated_at": {"type": "date"},
    },
}


def _vector_field(settings: Settings, dimension: int) -> dict[str, Any]:
    # No doc values: they are a third copy of each vector, read only by scripts, which no query uses.
    return {
        "type": "knn_vector",
        "dimension": dimension,
        "doc_values": False,
        "method": {
            "name": "hnsw",
            "engine": "lucene",
            "space_type": "cosinesimil",
            "parameters": {
                "m": settings.opensearch.hnsw_m,
                "ef_construction": settings.opensearch.hnsw_ef_construction,
            },
        },
    }


def document_mapping(settings: Settings, dimension: int) -> dict[str, Any]:
    """Whole-document fields, set on a document's first chunk only: the document ranking arms."""
    return {
        # BM25 needs term frequencies, not positions: no phrase query runs on a document's text.
        "document_text": {"type": "text", "analyzer": "english", "index_options": "freqs"},
        "document_embedding": _vector_field(settings, dimension),
    }


def _chunk_keywords() -> dict[str, Any]:
    """The chunk index's keyword fields that hold caller or content data."""
    return {
        "chunk_id": _keyword(),
        "headings": {"type": "text", "analyzer": "english", "fields": {"raw": _keyword()}},
        "keywords": _keyword(),
        "language": _keyword(),
        "page_label": _keyword(),
        "source_uri": _keyword(),
        "filename": _keyword(),
        "mime_type": _keyword(),
    }


def chunks_mapping(settings: Settings, model: str, dimension: int) -> dict[str, Any]:
    return {
        "dynamic": "strict",
        # Which model made the vectors: readers pick the query encoder from the index they query.
        "_meta": {"embedding_model": model, "embedding_dimension": dimension},
        # Vectors as JSON arrays were most of each chunk's bytes. Nothing reads them back: the search
        # arms query the vector files, a reembed encodes the stored text again, and the store stage
        # builds a document's mean vector from the vectors it is writing.
        "_source": {"excludes": VECTOR_FIELDS},
        "properties": {
            "tenant_id": {"type": "keyword"},
            "kb_id": {"type": "keyword"},
            "doc_id": {"type": "keyword"},
            "generation": {"type": "integer"},
            "chunk_idx": {"type": "integer"},
            "text": {"type": "text", "analyzer": "english"},
            "title": {"type": "text", "analyzer": "english"},
            "context": {"type": "text", "index": False},
            "page_num": {"type": "integer"},
            "char_start": {"type": "integer"},
            "char_end": {"type": "integer"},
            "token_count": {"type": "integer"},
            **_chunk_keywords(),
            # Caller metadata: verbatim in `_source`, typed terms in three fields that every
            # tenant's keys share (shared/search/metadata.py). `metadata` is where chunks copied
            # from an index of an earlier version keep theirs.
            "metadata": {"type": "object", "enabled": False},
            **metadata.mapping(),
            "created_at": {"type": "date"},
            "embedding": _vector_field(settings, dimension),
            **document_mapping(settings, dimension),
        },
    }


def ensure_indexes(client: OpenSearch, settings: Settings) -> None:
    """Create the registry, KB and chunk indexes and the chunk alias; add fields new to this version."""
    for name, mapping in ((kbs_index(settings), KBS_MAPPING), (docs_index(settings), DOCS_MAPPING)):
        if not create_index(client, name, {"settings": _small_index_settings(settings), "mappings": mapping}):
            # Adding fields is always allowed; a changed field type fails here, loudly.
            client.indices.put_mapping(index=name, body={"properties": mapping["properties"]})
    alias = chunks_alias(settings)
    model, dimension = settings.embedding.model, settings.embedding.dimension
    for earlier in earlier_shared_indexes(client, settings):
        # Indexes made before `_meta` existed learn their model (mapping `_meta` can always change).
        meta = {"embedding_model": model, "embedding_dimension": dimension}
        client.indices.put_mapping(index=earlier, body={"_meta": meta})
    # The alias spans every shared index of the model, the current layout's as its write index.
    # New knowledge bases go to that one; those already in an earlier one stay and are served
    # there (shared/search/placement.py), until a reembed moves them (docs/operations.md).
    body = chunk_index_body(settings, model, dimension, {alias: {"is_write_index": True}})
    create_index(client, chunks_index(settings, model), body)
    upgrade_chunk_indexes(client, settings)


def earlier_shared_indexes(client: OpenSearch, settings: Settings) -> list[str]:
    """The default model's shared chunk indexes of earlier layouts that exist, oldest first."""
    model = settings.embedding.model
    names = [chunks_index(settings, model, version) for version in range(1, LAYOUT)]
    return [name for name in names if client.indices.exists(index=name)]


def upgrade_chunk_indexes(client: OpenSearch, settings: Settings) -> None:
    """Give chunk indexes made by earlier versions the fields of this one (adding fields, and
    changing `ignore_above` or an object's `dynamic`, are allowed on a live index).

    Each index keeps its own dimension: a reembed's per-KB index may hold another model's vectors.
    An index made before the typed metadata fields keeps its dynamic `metadata` object, which
    chunks no longer write to; it stops adding fields (`dynamic: false`). Its old chunks are
    filterable by metadata again once re-ingested or reembedded (docs/operations.md).
    """
    mappings = client.indices.get_mapping(index=f"{chunks_alias(settings)}-*", ignore_unavailable=True)
    for index, mapping in mappings.items():
        properties = mapping["mappings"].get("properties", {})
        if "embedding" not in properties:
            continue
        fields: dict[str, Any] = {}
        if "document_embedding" not in properties:
            fields |= document_mapping(settings, int(properties["embedding"]["dimension"]))
        if metadata.SOURCE not in properties:
            fields |= {**_chunk_keywords(), **metadata.mapping()}
            if "metadata" in properties and properties["metadata"].get("enabled", True):
                fields["metadata"] = {"type": "object", "dynamic": False}
        if fields:
            _put_fields(client, index, fields)


def _put_fields(client: OpenSearch, index: str, fields: dict[str, Any]) -> None:
    """Add fields to an index; one whose dynamic metadata used up the field limit gets room for them."""
    try:
        client.indices.put_mapping(index=index, body={"properties": fields})
    except RequestError as error:
        if "Limit of total fields" not in str(error.info):
            raise
        key = "index.mapping.total_fields.limit"
        found = client.indices.get_settings(index=index, name=key, include_defaults=True)[index]
        limit = next(
            int(scope["index"]["mapping"]["total_fields"]["limit"])
            for scope in (found.get("settings", {}), found.get("defaults", {}))
            if "limit" in scope.get("index", {}).get("mapping", {}).get("total_fields", {})
        )
        # Each field may bring sub-fields (`headings.raw`): room for twice as many.
        client.indices.put_settings(index=index, body={key: limit + 2 * len(fields)})
        client.indices.put_mapping(index=index, body={"properties": fields})


def chunk_index_body(
    settings: Settings, model: str, dimension: int, aliases: dict[str, Any]
) -> dict[str, Any]:
    """Settings and mapping of a chunk index for one embedding model."""
    return {
        "settings": {
            "index": {
                "knn": True,
                "knn.algo_param.ef_search": settings.opensearch.hnsw_ef_search,
                "number_of_shards": settings.opensearch.shards,
                "number_of_replicas": settings.opensearch.replicas,
                "refresh_interval": settings.opensearch.refresh_interval,
                # `_source` is read for the few hits an answer fetches, and in a reembed's scroll.
                "codec": "best_compression",
            }
        },
        "mappings": chunks_mapping(settings, model, dimension),
        "aliases": aliases,
    }


def create_index(client: OpenSearch, name: str, body: dict[str, Any]) -> bool:
    """Create the index; False when it existed already."""
    if client.indices.exists(index=name):
        return False
    try:
        client.indices.create(index=name, body=body)
    except RequestError as error:
        # Two processes may race to create it; the loser finds it there.
        if error.error != "resource_already_exists_exception":
            raise
        return False
    return True


def drop_index(client: OpenSearch, name: str, *, missing_ok: bool = False) -> None:
    """Delete an index (or several, comma-joined); a missing one is an error unless `missing_ok`."""
    if missing_ok:
        client.indices.delete(index=name, ignore=[404])
    else:
        client.indices.delete(index=name)

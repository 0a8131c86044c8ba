"""The chunk indexes' owner: every write, delete and read of chunks goes through this module.

Bulk indexing (with per-item checks and retries), deletes of a document's generations or of a
whole knowledge base's chunks, refreshes, reads of a document's chunks, the search phases'
requests (shared/search/searcher.py), the scroll the reembed copies from (workers/reembed.py),
and the figures the bench reads. Index creation and mappings are shared/search/schema.py's;
aliases and physical index resolution are shared/search/placement.py's.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as OSConnectionError
from opensearchpy.exceptions import TransportError

from shared.config import Settings
from shared.errors import ErrorCode, PermanentError, RaglineError, TransientError
from shared.search.placement import index_model, kb_scope
from shared.search.schema import chunks_alias

log = logging.getLogger(__name__)

BULK_ACTIONS = 200
ITEM_RETRIES = 4
_RETRYABLE_STATUS = {429, 502, 503, 504}
Sources = list[tuple[str, dict[str, Any]]]


def doc_filter(tenant_id: str, kb_id: str, doc_id: str) -> list[dict[str, Any]]:
    return [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}, {"term": {"doc_id": doc_id}}]


# writes


def bulk_index(
    client: OpenSearch,
    index: str,
    docs: Sources,
    *,
    require_alias: bool = False,
    timed: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
) -> None:
    """Index (id, source) pairs; retry transient item failures, raise on permanent ones.

    `timed` wraps each bulk request (the worker passes its bulk-latency metric)."""
    pending = docs
    for attempt in range(ITEM_RETRIES + 1):
        failed: Sources = []
        for first in range(0, len(pending), BULK_ACTIONS):
            batch = pending[first : first + BULK_ACTIONS]
            body: list[dict[str, Any]] = []
            for doc_id, source in batch:
                action: dict[str, Any] = {"_index": index, "_id": doc_id}
                if require_alias:
                    action["require_alias"] = True
                body += [{"index": action}, source]
            try:
                with timed():
                    response = client.bulk(body=body)
            except (OSConnectionError, TransportError) as error:
                status = getattr(error, "status_code", None)
                if isinstance(status, int) and status not in _RETRYABLE_STATUS:
                    raise
                raise TransientError(f"OpenSearch bulk request failed ({type(error).__name__})") from None
            if not response.get("errors"):
                continue
            for (doc_id, source), item in zip(batch, response["items"], strict=True):
                result = item["index"]
                if result.get("status", 500) < 300:
                    continue
                if result.get("status") in _RETRYABLE_STATUS:
                    failed.append((doc_id, source))
                    continue
                raise PermanentError(
                    f"a chunk was rejected by the index ({rejection(result.get('error'))})",
                    code=ErrorCode.INVALID_ARGUMENT,
                )
        if not failed:
            return
        log.warning("bulk: %d items to retry (attempt %d)", len(failed), attempt + 1)
        pending = failed
        time.sleep(min(8.0, 0.5 * 2**attempt))
    raise TransientError(f"{len(pending)} chunks could not be indexed after {ITEM_RETRIES} retries")


def rejection(error: Any) -> str:
    """The kind of an item's rejection, from OpenSearch's exception types only: its `reason` quotes
    field names and values (caller metadata, document text), which a status or log never holds."""
    kinds: list[str] = []
    while isinstance(error, dict) and len(kinds) < 3:
        kind = error.get("type")
        if isinstance(kind, str) and re.fullmatch(r"[a-z_]{1,80}", kind):
            kinds.append(kind)
        error = error.get("caused_by")
    return ": ".join(kinds) or "unknown"


def refresh(client: OpenSearch, index: str) -> None:
    """Make what was written to `index` (an alias or a name) searchable now."""
    client.indices.refresh(index=index)


def delete_generations(
    client: OpenSearch, index: str, tenant_id: str, kb_id: str, doc_id: str, keep: int | None
) -> int:
    """Delete a document's chunks of every generation but `keep` (all when None); returns the count."""
    query: dict[str, Any] = {"bool": {"filter": doc_filter(tenant_id, kb_id, doc_id)}}
    if keep is not None:
        query["bool"]["must_not"] = [{"term": {"generation": keep}}]
    result = client.delete_by_query(index=index, body={"query": query}, refresh=True, conflicts="proceed")
    return int(result.get("deleted", 0))


def delete_generation(
    client: OpenSearch, index: str, tenant_id: str, kb_id: str, doc_id: str, generation: int
) -> None:
    """Delete one generation of a document's chunks from `index`, those written a moment ago too."""
    client.indices.refresh(index=index)
    query = {
        "bool": {"filter": [*doc_filter(tenant_id, kb_id, doc_id), {"term": {"generation": generation}}]}
    }
    client.delete_by_query(index=index, body={"query": query}, refresh=True, conflicts="proceed")


def delete_kb_chunks(client: OpenSearch, index: str, tenant_id: str, kb_id: str) -> None:
    """Delete every chunk of a knowledge base from `index` (aliases or names, comma-joined), those
    written a moment ago too (a worker's store refreshes after its bulk, not before this)."""
    client.indices.refresh(index=index)
    client.delete_by_query(
        index=index, body={"query": kb_scope(tenant_id, kb_id)}, refresh=True, conflicts="proceed"
    )


# reads


def read_chunks(
    client: OpenSearch,
    index: str,
    tenant_id: str,
    kb_id: str,
    doc_id: str,
    generation: int,
    chunk_idx: int | None,
    window: int,
) -> list[dict[str, Any]]:
    """The sources of a chunk and its neighbours (or the first chunks in order) of one generation."""
    filters: list[dict[str, Any]] = [
        *doc_filter(tenant_id, kb_id, doc_id),
        {"term": {"generation": generation}},
    ]
    if chunk_idx is not None:
        filters.append({"range": {"chunk_idx": {"gte": chunk_idx - window, "lte": chunk_idx + window}}})
    size = 2 * window + 1 if chunk_idx is not None else 200
    response = client.search(
        index=index,
        body={
            "size": size,
            "query": {"bool": {"filter": filters}},
            "sort": [{"chunk_idx": "asc"}],
            "_source": ["chunk_idx", "text", "headings", "page_num", "page_label"],
        },
    )
    return [hit["_source"] for hit in response["hits"]["hits"]]


def search_arms(client: OpenSearch, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first search phase: one `_msearch` of (header, body) lines; a response per body."""
    return list(client.msearch(body=lines)["responses"])


def fetch_hits(client: OpenSearch, indexes: list[str], body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The second search phase: the hits `body` asks for, by id; UNAVAILABLE when it fails."""
    try:
        response = client.search(index=",".join(indexes), body=body)
    except TransportError as error:
        raise RaglineError("the search index could not answer", code=ErrorCode.UNAVAILABLE) from error
    return {hit["_id"]: hit for hit in response["hits"]["hits"]}


def kb_chunk_pages(
    client: OpenSearch, index: str, tenant_id: str, kb_id: str, size: int
) -> Generator[list[dict[str, Any]], None, None]:
    """A KB's chunks in `index` without their vectors, page by page from one scroll snapshot, in
    (document, generation, chunk) order: what a reembed copies. The scroll is cleared when the
    iterator ends or is closed (use it in `contextlib.closing`)."""
    page = client.search(
        index=index,
        scroll="5m",
        size=size,
        body={
            "query": kb_scope(tenant_id, kb_id),
            "sort": [{"doc_id": "asc"}, {"generation": "asc"}, {"chunk_idx": "asc"}],
            "_source": {"excludes": ["embedding", "document_embedding"]},
        },
    )
    scroll_id = page.get("_scroll_id")
    try:
        while page["hits"]["hits"]:
            yield page["hits"]["hits"]
            page = client.scroll(scroll_id=scroll_id, scroll="5m")
            scroll_id = page.get("_scroll_id", scroll_id)
    finally:
        if scroll_id:
            client.clear_scroll(scroll_id=scroll_id, ignore=[404])


# the bench's figures (bench/): the stored chunks and the index as the service left them


def _every_chunk_index(settings: Settings) -> str:
    """The shared chunk indexes and those of KBs on a model of their own (not under the alias)."""
    return f"{chunks_alias(settings)}*"


def kb_tenant(client: OpenSearch, settings: Settings, kb_id: str) -> str:
    """The tenant of a chunk of `kb_id` (the bench knows its KB by id only)."""
    one = {"size": 1, "_source": ["tenant_id"], "query": {"term": {"kb_id": kb_id}}}
    response = client.search(index=_every_chunk_index(settings), body=one)
    return str(response["hits"]["hits"][0]["_source"]["tenant_id"])


def kb_chunk_texts(client: OpenSearch, settings: Settings, kb_id: str) -> list[str]:
    """The texts the pipeline embedded for `kb_id`'s chunks (context header included), as stored."""
    texts: list[str] = []
    client.indices.refresh(index=_every_chunk_index(settings))
    response = client.search(
        index=_every_chunk_index(settings),
        scroll="2m",
        body={"size": 1000, "query": {"term": {"kb_id": kb_id}}, "_source": ["text", "context"]},
    )
    try:
        while hits := response["hits"]["hits"]:
            texts += [
                f"{h['_source']['context']}\n{h['_source']['text']}"
                if h["_source"].get("context")
                else h["_source"]["text"]
                for h in hits
            ]
            response = client.scroll(scroll_id=response["_scroll_id"], scroll="2m")
    finally:  # else its search context holds segments open until it times out
        client.clear_scroll(scroll_id=response["_scroll_id"])
    return texts


# Lucene files by what they hold. The vector files are left out: each vector field has a format of
# its own, and the segment statistics key file sizes by extension, so the two fields' files of one
# extension overwrite each other there; the vectors' part is the segments' bytes less the others.
_FILE_PARTS = {
    "stored_fields": ("fdt", "fdx", "fdm"),
    "postings": ("tim", "tip", "tmd", "doc", "pos", "pay", "psm"),
    "doc_values": ("dvd", "dvm"),
    "norms": ("nvd", "nvm"),
    "points": ("kdd", "kdi", "kdm"),
    "segment_info": ("fnm", "si"),
}
_VECTOR_FILES = ("vec", "vex", "vem", "vemf", "veq", "vemq")
MERGE_TIMEOUT_S = 3600.0
LEASE_WAIT_S = 120.0


def expunge_deletes(client: OpenSearch, index: str) -> None:
    """Merge away the deleted chunks of `index` now (the bench's throwaway loads), not in the
    merges of the loads after them."""
    client.indices.refresh(index=index)
    client.indices.forcemerge(index=index, only_expunge_deletes=True, request_timeout=MERGE_TIMEOUT_S)


def merged_parts(client: OpenSearch, index: str) -> dict[str, Any]:
    """Force-merge `index` to one segment; its chunks, bytes, and bytes by part on primaries.

    Each `_source` has a recovery copy, with the fields `_source` excludes (the vectors), which a
    merge drops only for operations that the shards' retention leases and the last commit have
    both passed: so the merge waits for the leases and follows a flush, as a live index's merges
    come after its periodic flushes. Sizes come from the segments, not the store statistics,
    which OpenSearch caches for seconds and which then still count the segments the merge replaced.
    """
    leases_passed = _await_retention_leases(client, index, LEASE_WAIT_S)
    client.indices.flush(index=index)
    client.indices.forcemerge(index=index, max_num_segments=1, request_timeout=MERGE_TIMEOUT_S)
    client.indices.refresh(index=index)
    total = 0
    for copies in client.indices.segments(index=index)["indices"][index]["shards"].values():
        for copy in copies:
            if copy["routing"]["primary"]:
                total += sum(s["size_in_bytes"] for s in copy["segments"].values() if s["search"])
    stats = client.indices.stats(index=index, metric="docs,segments", include_segment_file_sizes=True)
    primaries = stats["_all"]["primaries"]
    files = {ext: int(f["size_in_bytes"]) for ext, f in primaries["segments"]["file_sizes"].items()}
    parts = {part: sum(files.get(ext, 0) for ext in exts) for part, exts in _FILE_PARTS.items()}
    known = set(_VECTOR_FILES).union(*_FILE_PARTS.values())
    parts["other"] = sum(size for ext, size in files.items() if ext not in known)
    parts["vectors_and_graphs"] = total - sum(parts.values())
    chunks = int(primaries["docs"]["count"])
    vectors = chunks + _count(client, index, {"exists": {"field": "document_embedding"}})
    _, dimension = index_model(client, index)
    return {
        "index": index,
        "chunks": chunks,
        "bytes": total,
        "parts": parts,
        "float32_vector_bytes": vectors * dimension * 4,
        "leases_passed": leases_passed,
    }


def await_merges(client: OpenSearch, index: str, timeout_s: float, settle_s: float = 3.0) -> bool:
    """Wait until `index` has run no merge for `settle_s` (or `timeout_s` has passed: False). What
    a load wrote is then merged, so a measurement taken next does not share the cores with the
    merges. One reading of none running is not enough: a refresh (every second) writes a segment
    and its merge starts a moment later, so the count must stay at none, and the merges done stay
    as many, across more than a refresh interval."""
    deadline = time.monotonic() + timeout_s
    quiet_since, done = None, -1
    while True:
        merges = client.indices.stats(index=index, metric="merge")["_all"]["total"]["merges"]
        now = time.monotonic()
        if merges["current"] or merges["total"] != done:
            quiet_since, done = None if merges["current"] else now, merges["total"]
        elif quiet_since is not None and now - quiet_since >= settle_s:
            return True
        if now > deadline:
            return False
        time.sleep(0.5)


def _count(client: OpenSearch, index: str, query: dict[str, Any]) -> int:
    return int(client.count(index=index, body={"query": query})["count"])


def _await_retention_leases(client: OpenSearch, index: str, timeout_s: float) -> bool:
    """Wait until every primary's retention leases retain no operation already indexed (OpenSearch
    syncs them every 30 s by default); False when `timeout_s` passed first."""
    deadline = time.monotonic() + timeout_s
    while True:
        shards = client.indices.stats(index=index, metric="docs", level="shards")["indices"][index]["shards"]
        primaries = [c for copies in shards.values() for c in copies if c["routing"]["primary"]]
        if all(
            lease["retaining_seq_no"] > copy["seq_no"]["max_seq_no"]
            for copy in primaries
            for lease in copy["retention_leases"]["leases"]
        ):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)

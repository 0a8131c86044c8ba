"""The registry of knowledge bases and documents, kept in OpenSearch (the system of record).

It owns every request on the knowledge-base and document indexes: record reads and writes, and
the queries over records (listing, counts, batch views, visibility for search, deletes by scope).

Document and knowledge-base writes are optimistic: every update names the `_seq_no`/`_primary_term`
it read, so two writers can never both advance the same record; the loser gets `Conflict` and
re-reads.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConflictError, NotFoundError

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.models import DocStatus, Document, KnowledgeBase, utcnow
from shared.search.schema import docs_index, kbs_index


class Conflict(RaglineError):
    """The record changed since it was read."""

    code = ErrorCode.CONFLICT


class NotFound(RaglineError):
    code = ErrorCode.NOT_FOUND


KB_WRITE_ATTEMPTS = 5
# How long a KB's last sweep deletes only the versions it read: past it, a writer that keeps
# changing a record loses it anyway (`Registry.delete_kb_records`).
FENCED_SWEEP_S = 10.0
_GONE = [DocStatus.DELETING.value, DocStatus.DELETED.value]
_PAGE = 500  # records read in one search
_SWEEP_PAUSE_S = 0.05


def _check_model_change(current: KnowledgeBase, updated: KnowledgeBase) -> None:
    """A KB's embedding model changes only when its reembed ends, and only to that reembed's model."""
    if (updated.embedding_model, updated.embedding_dimension) == (
        current.embedding_model,
        current.embedding_dimension,
    ):
        return
    if (
        current.reembed is None
        or updated.reembed is not None
        or updated.embedding_model != current.reembed.model
    ):
        raise Conflict(
            f"knowledge base '{current.kb_id}': its embedding model changes only through a reembed",
        )


@dataclass
class Versioned:
    """A document together with the version it was read at."""

    doc: Document
    seq_no: int
    primary_term: int


def kb_key(tenant_id: str, kb_id: str) -> str:
    return f"{tenant_id}/{kb_id}"


def doc_key(tenant_id: str, kb_id: str, doc_id: str) -> str:
    # tenant and kb ids cannot hold "/", so the key is unambiguous even when doc_id does.
    return f"{tenant_id}/{kb_id}/{doc_id}"


# The knowledge bases read so far in a `Registry.kb_snapshots()` block, by (tenant, kb).
_kb_snapshots: ContextVar[dict[tuple[str, str], KnowledgeBase] | None] = ContextVar(
    "kb_snapshots", default=None
)


@dataclass(frozen=True)
class KbCounts:
    """A knowledge base's documents that are not deleted, their chunks, and the documents by status."""

    documents: int = 0
    chunks: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


class Registry:
    """Reads and writes knowledge bases and document records for one deployment."""

    def __init__(self, client: OpenSearch, settings: Settings) -> None:
        self.client = client
        self.kbs = kbs_index(settings)
        self.docs = docs_index(settings)

    # knowledge bases

    def create_kb(self, kb: KnowledgeBase) -> KnowledgeBase:
        body = kb.model_dump(mode="json")
        try:
            self.client.index(
                index=self.kbs,
                id=kb_key(kb.tenant_id, kb.kb_id),
                body=body,
                op_type="create",
                refresh="wait_for",
            )
        except ConflictError:
            with contextlib.suppress(NotFound):  # a resent create that met itself: see replace_doc
                if self.get_kb(kb.tenant_id, kb.kb_id).model_dump(mode="json") == body:
                    return kb
            raise Conflict(f"knowledge base '{kb.kb_id}' already exists") from None
        return kb

    @contextlib.contextmanager
    def kb_snapshots(self) -> Iterator[None]:
        """Within the block, each knowledge base is read once: every stage a worker task runs sees
        the same version of its settings, and a chain of light stages costs one read, not one each."""
        token = _kb_snapshots.set({})
        try:
            yield
        finally:
            _kb_snapshots.reset(token)

    def get_kb(self, tenant_id: str, kb_id: str) -> KnowledgeBase:
        snapshots = _kb_snapshots.get()
        if snapshots is not None and (tenant_id, kb_id) in snapshots:
            return snapshots[(tenant_id, kb_id)].model_copy(deep=True)
        try:
            found = self.client.get(index=self.kbs, id=kb_key(tenant_id, kb_id))
        except NotFoundError:
            raise NotFound(f"knowledge base '{kb_id}' not found") from None
        kb = KnowledgeBase.model_validate(found["_source"])
        if snapshots is not None:
            snapshots[(tenant_id, kb_id)] = kb.model_copy(deep=True)
        return kb

    def existing_kb_ids(self, tenant_id: str, kb_ids: list[str]) -> set[str]:
        """Which of `kb_ids` the tenant has: one realtime multi-get, no records read."""
        if not kb_ids:
            return set()
        found = self.client.mget(
            index=self.kbs, body={"ids": [kb_key(tenant_id, kb) for kb in kb_ids]}, _source=False
        )
        return {kb for kb, entry in zip(kb_ids, found["docs"], strict=True) if entry.get("found")}

    def update_kb(
        self, tenant_id: str, kb_id: str, change: Callable[[KnowledgeBase], KnowledgeBase]
    ) -> KnowledgeBase:
        """Apply `change` to the stored KB and write the result if nobody wrote in between.

        Optimistic like document writes: the write names the `_seq_no`/`_primary_term` it read.
        On a lost race the record is read again and `change` applied to it afresh, so `change`
        must express the caller's intent on whatever record it is given (and may raise to refuse
        it); after `KB_WRITE_ATTEMPTS` lost races, Conflict. The embedding model only changes as
        the end of a reembed, to the reembed's model: any other change of it is a Conflict.
        """
        key = kb_key(tenant_id, kb_id)
        for _ in range(KB_WRITE_ATTEMPTS):
            try:
                found = self.client.get(index=self.kbs, id=key)
            except NotFoundError:
                raise NotFound(f"knowledge base '{kb_id}' not found") from None
            current = KnowledgeBase.model_validate(found["_source"])
            updated = change(current.model_copy(deep=True))
            _check_model_change(current, updated)
            updated.updated_at = utcnow()
            body = updated.model_dump(mode="json")
            try:
                self.client.index(
                    index=self.kbs,
                    id=key,
                    body=body,
                    if_seq_no=found["_seq_no"],
                    if_primary_term=found["_primary_term"],
                    refresh="wait_for",
                )
            except ConflictError:
                # The client resends a write whose reply it lost; the resend meets the write itself.
                again = self.client.get(index=self.kbs, id=key)
                if again["_source"] == body:
                    return updated
                continue
            return updated
        raise Conflict(f"knowledge base '{kb_id}' is being changed concurrently; retry")

    def save_kb(self, kb: KnowledgeBase) -> KnowledgeBase:
        """Write the KB unconditionally (last writer wins): for tests and repairs; use update_kb."""
        kb.updated_at = utcnow()
        self.client.index(
            index=self.kbs,
            id=kb_key(kb.tenant_id, kb.kb_id),
            body=kb.model_dump(mode="json"),
            refresh="wait_for",
        )
        return kb

    def list_kbs(self, tenant_id: str, limit: int = 1000) -> list[KnowledgeBase]:
        response = self.client.search(
            index=self.kbs,
            body={"size": limit, "query": {"term": {"tenant_id": tenant_id}}, "sort": [{"kb_id": "asc"}]},
        )
        return [KnowledgeBase.model_validate(hit["_source"]) for hit in response["hits"]["hits"]]

    def delete_kb(self, tenant_id: str, kb_id: str) -> None:
        try:
            self.client.delete(index=self.kbs, id=kb_key(tenant_id, kb_id), refresh="wait_for")
        except NotFoundError:
            raise NotFound(f"knowledge base '{kb_id}' not found") from None

    # documents

    def get_doc(self, tenant_id: str, kb_id: str, doc_id: str) -> Versioned | None:
        try:
            found = self.client.get(index=self.docs, id=doc_key(tenant_id, kb_id, doc_id))
        except NotFoundError:
            return None
        return Versioned(Document.model_validate(found["_source"]), found["_seq_no"], found["_primary_term"])

    def drop_doc(self, doc: Document) -> None:
        """Delete the document's record, whatever its version (its KB is gone: see Ingestor)."""
        with contextlib.suppress(NotFoundError):
            self.client.delete(
                index=self.docs, id=doc_key(doc.tenant_id, doc.kb_id, doc.doc_id), refresh=True
            )

    def require_doc(self, tenant_id: str, kb_id: str, doc_id: str) -> Versioned:
        found = self.get_doc(tenant_id, kb_id, doc_id)
        if found is None:
            raise NotFound(f"document '{doc_id}' not found in knowledge base '{kb_id}'")
        return found

    def create_doc(self, doc: Document) -> Versioned:
        """Insert a new record; Conflict when one exists already."""
        body = doc.model_dump(mode="json")
        try:
            result = self.client.index(
                index=self.docs,
                id=doc_key(doc.tenant_id, doc.kb_id, doc.doc_id),
                body=body,
                op_type="create",
            )
        except ConflictError:
            return self._own_write(doc, body)
        return Versioned(doc, result["_seq_no"], result["_primary_term"])

    def replace_doc(self, current: Versioned, doc: Document) -> Versioned:
        """Write `doc` if the record is still at `current`'s version; Conflict otherwise."""
        doc.updated_at = utcnow()
        body = doc.model_dump(mode="json")
        try:
            result = self.client.index(
                index=self.docs,
                id=doc_key(doc.tenant_id, doc.kb_id, doc.doc_id),
                body=body,
                if_seq_no=current.seq_no,
                if_primary_term=current.primary_term,
            )
        except ConflictError:
            return self._own_write(doc, body)
        return Versioned(doc, result["_seq_no"], result["_primary_term"])

    def _own_write(self, doc: Document, body: dict[str, Any]) -> Versioned:
        """The stored record when it is this very write; Conflict when another write won.

        The client resends a request whose reply it lost (a node stopped after applying it), and
        the resend conflicts with the write itself. A record holding exactly this body, its fresh
        timestamps included, means the write landed.
        """
        stored = self.get_doc(doc.tenant_id, doc.kb_id, doc.doc_id)
        if stored is not None and stored.doc.model_dump(mode="json") == body:
            return stored
        raise Conflict(f"document '{doc.doc_id}' changed concurrently")

    def search_docs(
        self, query: dict[str, Any], *, size: int, sort: list[Any], search_after: list[Any] | None = None
    ) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"size": size, "query": query, "sort": sort, "seq_no_primary_term": True}
        if search_after:
            body["search_after"] = search_after
        return list(self.client.search(index=self.docs, body=body)["hits"]["hits"])

    def refresh_docs(self) -> None:
        """Make records written a moment ago visible to the searches below."""
        self.client.indices.refresh(index=self.docs)

    def doc_fields(
        self, tenant_id: str, keys: list[tuple[str, str]], fields: list[str]
    ) -> list[dict[str, Any] | None]:
        """`fields` of each (kb, doc) record, in order, None where there is none: one realtime
        multi-get."""
        found = self.client.mget(
            index=self.docs,
            body={"ids": [doc_key(tenant_id, kb, doc) for kb, doc in keys]},
            _source_includes=fields,
        )
        return [entry.get("_source") for entry in found["docs"]]

    def visible_generations(self, tenant_id: str, keys: list[tuple[str, str]]) -> set[tuple[str, str, int]]:
        """(kb, doc, generation) triples that readers may see: each document's active generation."""
        if not keys:
            return set()
        visible = set()
        for record in self.doc_fields(tenant_id, keys, ["kb_id", "doc_id", "status", "active_generation"]):
            if not record or record["status"] in _GONE:
                continue
            if record.get("active_generation") is not None:
                visible.add((record["kb_id"], record["doc_id"], int(record["active_generation"])))
        return visible

    def active_generations(self, tenant_id: str, kb_id: str, doc_ids: set[str]) -> dict[str, int]:
        """doc_id -> the generation readers see, for documents that are not deleted."""
        keys = [(kb_id, d) for d in sorted(doc_ids)]
        active: dict[str, int] = {}
        for record in self.doc_fields(tenant_id, keys, ["doc_id", "status", "active_generation"]):
            if record and record["status"] not in _GONE and record.get("active_generation") is not None:
                active[record["doc_id"]] = int(record["active_generation"])
        return active

    def kb_counts(self, tenant_id: str, kb_ids: list[str]) -> dict[str, KbCounts]:
        """kb_id -> the counts of its records that are not deleted."""
        if not kb_ids:
            return {}
        response = self.client.search(
            index=self.docs,
            body={
                "size": 0,
                "query": {
                    "bool": {
                        "filter": [{"term": {"tenant_id": tenant_id}}, {"terms": {"kb_id": kb_ids}}],
                        "must_not": [{"terms": {"status": _GONE[::-1]}}],
                    }
                },
                "aggs": {
                    "kbs": {
                        "terms": {"field": "kb_id", "size": len(kb_ids)},
                        "aggs": {
                            "chunks": {"sum": {"field": "chunk_count"}},
                            "status": {"terms": {"field": "status", "size": len(DocStatus)}},
                        },
                    }
                },
            },
        )
        return {
            b["key"]: KbCounts(
                b["doc_count"],
                int(b["chunks"]["value"]),
                {s["key"]: s["doc_count"] for s in b["status"]["buckets"]},
            )
            for b in response["aggregations"]["kbs"]["buckets"]
        }

    def batch_counts(self, tenant_id: str, batch_id: str) -> tuple[int, dict[str, int]]:
        """A batch's record count and its counts by status."""
        response = self.client.search(
            index=self.docs,
            body={
                "size": 0,
                "query": _batch_scope(tenant_id, batch_id),
                "track_total_hits": True,
                "aggs": {"status": {"terms": {"field": "status", "size": 20}}},
            },
        )
        counts = {b["key"]: b["doc_count"] for b in response["aggregations"]["status"]["buckets"]}
        return int(response["hits"]["total"]["value"]), counts

    def batch_failures(self, tenant_id: str, batch_id: str) -> list[dict[str, Any]]:
        """The failed records of a batch (the first 1000 by doc_id), as search hits."""
        scope = _batch_scope(tenant_id, batch_id)
        failed = {
            "bool": {"filter": [*scope["bool"]["filter"], {"term": {"status": DocStatus.FAILED.value}}]}
        }
        return self.search_docs(failed, size=1000, sort=[{"doc_id": "asc"}])

    def status_counts(self, request_timeout: float) -> dict[str, int]:
        """Records by status, over every tenant (the metrics)."""
        response = self.client.search(
            index=self.docs,
            body={"size": 0, "aggs": {"status": {"terms": {"field": "status", "size": 20}}}},
            request_timeout=request_timeout,
        )
        return {b["key"]: int(b["doc_count"]) for b in response["aggregations"]["status"]["buckets"]}

    def live_hashes(self, sha256s: list[str]) -> set[str]:
        """Those of the content hashes that a live record, in any tenant, has."""
        self.refresh_docs()  # a record written a moment ago is found by a search only after it
        live = {
            "bool": {
                "filter": [{"terms": {"content_hash": sha256s}}],
                "must_not": [{"terms": {"status": _GONE}}],
            }
        }
        hashes = {"terms": {"field": "content_hash", "size": len(sha256s)}}
        response = self.client.search(index=self.docs, body={"size": 0, "query": live, "aggs": {"h": hashes}})
        return {str(bucket["key"]) for bucket in response["aggregations"]["h"]["buckets"]}

    def source_documents(
        self, tenant_id: str, kb_id: str, source_id: str, batch_id: str | None = None
    ) -> dict[str, DocStatus]:
        """The status of every document a source brought (those of one batch, given `batch_id`), by
        doc_id (written a moment ago too)."""
        terms = [{"term": {"source_id": source_id}}]
        if batch_id is not None:
            terms.append({"term": {"batch_id": batch_id}})
        query = {"bool": {"filter": [*_kb_scope(tenant_id, kb_id)["bool"]["filter"], *terms]}}
        self.refresh_docs()
        found: dict[str, DocStatus] = {}
        after: list[Any] | None = None
        while True:
            hits = self.client.search(
                index=self.docs,
                body={
                    "size": _PAGE,
                    "query": query,
                    "sort": [{"doc_id": "asc"}],
                    "_source": ["doc_id", "status"],
                    **({"search_after": after} if after is not None else {}),
                },
            )["hits"]["hits"]
            found.update({hit["_source"]["doc_id"]: DocStatus(hit["_source"]["status"]) for hit in hits})
            if len(hits) < _PAGE:
                return found
            after = hits[-1]["sort"]

    def has_source_documents(self, tenant_id: str, kb_id: str, source_id: str) -> bool:
        """Whether a live document (neither deleted nor being deleted) carries the source's id."""
        gone = [DocStatus.DELETED.value, DocStatus.DELETING.value]
        scope = _kb_scope(tenant_id, kb_id)["bool"]["filter"]
        query = {
            "bool": {
                "filter": [*scope, {"term": {"source_id": source_id}}],
                "must_not": [{"terms": {"status": gone}}],
            }
        }
        self.refresh_docs()
        found = self.client.search(index=self.docs, body={"size": 0, "query": query, "terminate_after": 1})
        return int(found["hits"]["total"]["value"]) > 0

    def detach_source(self, tenant_id: str, kb_id: str, source_id: str) -> None:
        """The documents of a source forgotten with its documents kept become uploads: an upload
        may replace them, and no source added again under that id owns them (its removal deleted
        them). A task of the cluster, left to finish on its own, so a source of any size answers
        at once: a record written meanwhile (a stage of its pipeline) keeps its source id, and
        that stage, meeting this write, is run again after its lease."""
        query = {
            "bool": {
                "filter": [*_kb_scope(tenant_id, kb_id)["bool"]["filter"], {"term": {"source_id": source_id}}]
            }
        }
        self.client.update_by_query(
            index=self.docs,
            body={"query": query, "script": {"source": "ctx._source.source_id = null", "lang": "painless"}},
            conflicts="proceed",
            refresh=True,
            wait_for_completion=False,
        )

    def settled_since(self, tenant_id: str, kb_id: str, since: datetime) -> Iterator[dict[str, Any]]:
        """The KB's records updated since `since` that are ready, failed or deleted, page by page
        in doc_id order (what a reembed sweeps)."""
        settled = [DocStatus.READY.value, DocStatus.FAILED.value, DocStatus.DELETED.value]
        query = {
            "bool": {
                "filter": [
                    *_kb_scope(tenant_id, kb_id)["bool"]["filter"],
                    {"range": {"updated_at": {"gte": since.isoformat()}}},
                    {"terms": {"status": settled}},
                ]
            }
        }
        after: list[Any] | None = None
        while True:
            hits = self.search_docs(query, size=_PAGE, sort=[{"doc_id": "asc"}], search_after=after)
            yield from (hit["_source"] for hit in hits)
            if len(hits) < _PAGE:
                return
            after = hits[-1]["sort"]

    def delete_kb_records(
        self, tenant_id: str, kb_id: str, fields: list[str], *, final: bool
    ) -> list[Document]:
        """Delete the KB's document records, those written a moment ago too, and return each as
        it was when deleted (`fields` only), so its artifacts and bytes can go with it.

        Each delete names the version read, so what is returned is what went; a record a writer
        changed meanwhile is read again on the next pass. A first sweep, while the KB stands and
        may still take uploads, makes one pass and leaves such records to the final one. The final
        sweep runs once the KB record is gone, when a writer only fails (its write names a version
        that is gone) or takes back what it wrote (shared/ingest.py `_kb_stands`): it passes until
        no record is left, and after FENCED_SWEEP_S deletes whatever version it finds, so a writer
        that keeps winning cannot make the deletion fail half done.
        """
        deleted: list[Document] = []
        fenced_until = time.monotonic() + FENCED_SWEEP_S
        while True:
            found, gone = self._delete_pass(tenant_id, kb_id, fields, fenced=time.monotonic() < fenced_until)
            deleted += gone
            if not final or not found:
                return deleted
            if len(gone) < found:
                time.sleep(_SWEEP_PAUSE_S)  # a writer is between its read and its write

    def _delete_pass(
        self, tenant_id: str, kb_id: str, fields: list[str], *, fenced: bool
    ) -> tuple[int, list[Document]]:
        """One pass over the KB's records, page by page: how many were found, and those deleted."""
        scope = _kb_scope(tenant_id, kb_id)
        found, deleted = 0, []
        after: list[Any] | None = None
        self.refresh_docs()
        while True:
            body: dict[str, Any] = {
                "size": _PAGE,
                "query": scope,
                "sort": [{"doc_id": "asc"}],
                "_source": fields,
                "seq_no_primary_term": True,
                **({"search_after": after} if after is not None else {}),
            }
            hits = self.client.search(index=self.docs, body=body)["hits"]["hits"]
            found += len(hits)
            if hits:
                actions = [{"delete": _delete_action(self.docs, hit, fenced)} for hit in hits]
                items = self.client.bulk(body=actions, refresh=True)["items"]
                deleted += [
                    Document.model_validate(hit["_source"])
                    for hit, item in zip(hits, items, strict=True)
                    if item["delete"].get("result") == "deleted"
                ]
            if len(hits) < _PAGE:
                return found, deleted
            after = hits[-1]["sort"]


def _delete_action(index: str, hit: dict[str, Any], fenced: bool) -> dict[str, Any]:
    """A bulk delete of a record read as `hit`; `fenced`: only while it still is that version."""
    action = {"_index": index, "_id": hit["_id"]}
    if fenced:
        action |= {"if_seq_no": hit["_seq_no"], "if_primary_term": hit["_primary_term"]}
    return action


def _kb_scope(tenant_id: str, kb_id: str) -> dict[str, Any]:
    return {"bool": {"filter": [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}]}}


def _batch_scope(tenant_id: str, batch_id: str) -> dict[str, Any]:
    return {"bool": {"filter": [{"term": {"tenant_id": tenant_id}}, {"term": {"batch_id": batch_id}}]}}

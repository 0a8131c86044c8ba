"""Reading and managing knowledge bases, documents and batches: what REST, MCP and the CLI share.

The queries themselves belong to their stores' owners: records to the Registry (shared/registry.py),
chunks to shared/search/chunk_index.py, aliases and indexes to placement.py and schema.py.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel, Field

from shared import erasure, fairqueue
from shared.config import Settings
from shared.embedding import ModelUnavailable, encoder, for_model, servable_models
from shared.errors import ErrorCode, RaglineError, TransientError
from shared.ingest import Ingestor
from shared.models import DocStatus, Document, KbSettings, KnowledgeBase, Reembed, check_pii_settings
from shared.queue import enqueue
from shared.registry import KbCounts, Registry, kb_key
from shared.search.chunk_index import delete_kb_chunks, read_chunks
from shared.search.placement import (
    attach_to_default,
    attach_to_own,
    drop_aliases,
    own_indexes,
    resolve_one,
    write_targets,
)
from shared.search.schema import drop_index
from shared.sources.store import SourceStore
from shared.stripe_locks import StripeLocks

TERMINAL = [DocStatus.READY.value, DocStatus.FAILED.value, DocStatus.DELETED.value]
REEMBED_TASK = "ragline.reembed"
# How long a create or a delete of a KB waits for another of the same id, then UNAVAILABLE: long
# enough for a create, short, as the wait holds one of the API's threads, which all tenants share.
KB_LOCK_WAIT_S = 0.5


class KbView(BaseModel):
    """A knowledge base with its live counts."""

    kb_id: str
    name: str
    description: str
    tags: list[str]
    settings: KbSettings
    embedding_model: str
    embedding_dimension: int
    reembed: Reembed | None
    reembed_error: str | None
    document_count: int = Field(description="Documents not deleted: queued, in work, ready or failed.")
    documents_by_status: dict[str, int] = Field(
        description="Those documents by status (queued, a stage's status such as embedding, ready, "
        "failed); a status no document has is left out."
    )
    chunk_count: int = Field(
        description="Their chunks; a document in work counts its new version's once chunked."
    )
    created_at: str
    updated_at: str


class KbChanges(BaseModel):
    model_config = {"extra": "forbid"}
    name: str | None = Field(None, min_length=1, max_length=200)
    description: str | None = Field(None, max_length=4000)
    tags: list[str] | None = Field(None, max_length=50)
    settings: KbSettings | None = None


class DocumentPage(BaseModel):
    documents: list[dict[str, Any]]
    next_cursor: str | None


class DocumentStatus(BaseModel):
    """A document's status as agents poll it."""

    kb_id: str
    doc_id: str
    status: str
    stage: str | None
    progress: float
    attempts: int
    error: dict[str, Any] | None
    title: str | None
    filename: str | None
    source_uri: str | None
    source_id: str | None = Field(None, description="The source that brought it (none: an upload).")
    mime_type: str | None
    file_size: int
    content_version: int
    outcome: str | None = Field(
        None, description="What this version brought: created, updated, or unchanged (a URL fetched again)."
    )
    chunk_count: int
    pii: dict[str, int]
    timings: dict[str, float]
    batch_id: str | None
    created_at: str
    updated_at: str


class ChunkView(BaseModel):
    chunk_idx: int
    text: str
    headings: list[str]
    page_num: int | None
    page_label: str | None


class DocumentText(BaseModel):
    kb_id: str
    doc_id: str
    title: str | None
    total_chunks: int
    chunks: list[ChunkView]


class BatchView(BaseModel):
    batch_id: str
    total: int
    counts: dict[str, int]
    done: bool
    failures: list[dict[str, Any]]


def document_view(doc: Document) -> dict[str, Any]:
    """The status object users see (no internal claim fields)."""
    internal = {"claimed_by", "tenant_id", "queue", "transitions", "trace"}
    return doc.model_dump(mode="json", exclude=internal) | {"transitions": doc.transitions[-20:]}


def _encode_cursor(values: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode()


def _decode_cursor(cursor: str) -> list[Any]:
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except ValueError:
        raise RaglineError("invalid cursor", code=ErrorCode.INVALID_ARGUMENT) from None
    if not isinstance(values, list):
        raise RaglineError("invalid cursor", code=ErrorCode.INVALID_ARGUMENT)
    return values


class Catalog:
    """Tenant-scoped reads and management; every query carries the caller's tenant."""

    def __init__(self, settings: Settings, registry: Registry, ingestor: Ingestor) -> None:
        self.settings = settings
        self.registry = registry
        self.ingestor = ingestor
        self.client = registry.client
        self.sources = SourceStore(registry.client, settings)
        # A KB's create and its delete, one at a time: a deletion sweeps by tenant and KB id after
        # the KB record is gone, and would take the documents of a new KB of the same id.
        self.kb_locks = StripeLocks(
            ingestor.broker,
            "ragline:kb-lifecycle",
            wait_s=KB_LOCK_WAIT_S,
            poll_s=0.05,
            busy="the knowledge base is being created or deleted; retry shortly",
        )

    def view(self, kb: KnowledgeBase, counts: KbCounts) -> KbView:
        return KbView(
            kb_id=kb.kb_id,
            name=kb.name,
            description=kb.description,
            tags=kb.tags,
            settings=kb.settings,
            embedding_model=kb.embedding_model,
            embedding_dimension=kb.embedding_dimension,
            reembed=kb.reembed,
            reembed_error=kb.reembed_error,
            document_count=counts.documents,
            documents_by_status=counts.by_status,
            chunk_count=counts.chunks,
            created_at=kb.created_at.isoformat(),
            updated_at=kb.updated_at.isoformat(),
        )

    def list_kbs(self, tenant_id: str) -> list[KbView]:
        kbs = self.registry.list_kbs(tenant_id)
        counts = self.registry.kb_counts(tenant_id, [kb.kb_id for kb in kbs])
        return [self.view(kb, counts.get(kb.kb_id, KbCounts())) for kb in kbs]

    def get_kb(self, tenant_id: str, kb_id: str) -> KbView:
        kb = self.registry.get_kb(tenant_id, kb_id)
        return self.view(kb, self.registry.kb_counts(tenant_id, [kb_id]).get(kb_id, KbCounts()))

    def create_kb(
        self,
        tenant_id: str,
        kb_id: str,
        name: str,
        description: str = "",
        tags: list[str] | None = None,
        settings: KbSettings | None = None,
        model: str | None = None,
    ) -> KbView:
        """A new KB on the default model's shared index, or, for another model, on an index of its
        own (as a reembed would leave it)."""
        if settings is not None:
            check_pii_settings(settings.pii_policy, settings.pii_entities)
        model = model or self.settings.embedding.model
        dimension = self._dimension(model)
        kb = KnowledgeBase(
            tenant_id=tenant_id,
            kb_id=kb_id,
            name=name,
            description=description,
            tags=tags or [],
            settings=settings or KbSettings(),
            embedding_model=model,
            embedding_dimension=dimension,
        )
        with self.kb_locks.exclusive(kb_key(tenant_id, kb_id)):
            self.registry.create_kb(kb)
            if model == self.settings.embedding.model:
                attach_to_default(self.client, self.settings, [(tenant_id, kb_id)])
            else:
                try:
                    attach_to_own(self.client, self.settings, tenant_id, kb_id, model, dimension)
                except Exception:
                    self.registry.delete_kb(tenant_id, kb_id)  # no KB without the index of its model
                    raise
        return self.view(kb, KbCounts())

    def _dimension(self, model: str) -> int:
        """The vector dimension of a model this server may serve, from its encoder (the API embeds
        the KB's queries with it anyway); INVALID_ARGUMENT for any other model."""
        self._check_servable(model)
        if model == self.settings.embedding.model:
            return self.settings.embedding.dimension
        try:
            return encoder(for_model(self.settings.embedding, model)).dimension
        except ModelUnavailable as error:
            raise RaglineError(str(error), code=ErrorCode.UNAVAILABLE) from None

    def _check_servable(self, model: str) -> None:
        allowed = servable_models(self.settings.embedding)
        if model not in allowed:
            raise RaglineError(
                f"unknown embedding model; known: {allowed}",
                code=ErrorCode.INVALID_ARGUMENT,
                details={"known": allowed},
            )

    def update_kb(self, tenant_id: str, kb_id: str, changes: KbChanges) -> KbView:
        """Apply the changed fields to the current record (optimistic: a racing write, such as a
        reembed finishing, is read and kept; the fields are simply set again on it)."""
        if changes.settings is not None:
            check_pii_settings(changes.settings.pii_policy, changes.settings.pii_entities)
        fields = {name: value for name, value in changes if value is not None}

        def apply(kb: KnowledgeBase) -> KnowledgeBase:
            return kb.model_copy(update=fields)

        self.registry.update_kb(tenant_id, kb_id, apply)
        return self.get_kb(tenant_id, kb_id)

    def delete_kb(self, tenant_id: str, kb_id: str) -> None:
        """Delete the KB, its documents' records, every chunk, and their bytes in the blob store
        (those no other live record shares). A create of the same id, or a second delete, is
        UNAVAILABLE until this one is done (`kb_locks`)."""
        with self.kb_locks.exclusive(kb_key(tenant_id, kb_id)):
            self._delete_kb(tenant_id, kb_id)

    def _delete_kb(self, tenant_id: str, kb_id: str) -> None:
        self.registry.get_kb(tenant_id, kb_id)
        self.sources.drop_kb(tenant_id, kb_id)  # its sources first: a run under way stops
        fairqueue.purge(self.ingestor.broker, tenant_id, kb_id)  # its waiting documents go first
        try:
            targets = write_targets(self.client, self.settings, tenant_id, kb_id)
        except TransientError:
            # No placement: a create on another model failed between its own index and its alias.
            # Nothing was written through an alias; the own index goes below with the rest.
            targets = []
        if targets:
            delete_kb_chunks(self.client, ",".join(t.alias for t in targets), tenant_id, kb_id)
        erasure.drop_kb_documents(
            self.registry, self.ingestor.blobs, self.ingestor.broker, tenant_id, kb_id, final=False
        )
        # Indexes of its own go too; the shared index only loses its chunks. The alias goes with
        # its index or after it, and the record last: while it stands, a delete that fails can be
        # resent and still finds the KB's chunks.
        own = own_indexes(self.client, self.settings, tenant_id, kb_id)
        if own:
            drop_index(self.client, ",".join(own))
        drop_aliases(self.client, self.settings, tenant_id, kb_id)
        self.registry.delete_kb(tenant_id, kb_id)
        # What was added while this ran (its KB still stood) would outlive it: a source, a
        # document, chunks a worker stored after the first delete. From now on an addition finds
        # the KB gone (Sources.add and the Ingestor check again after their write, and take it
        # back; a worker's write names a record version that is gone), and no new KB of the same
        # id exists until this ends: the last sweeps take everything of this tenant and KB id.
        self.sources.drop_kb(tenant_id, kb_id)
        erasure.drop_kb_documents(
            self.registry, self.ingestor.blobs, self.ingestor.broker, tenant_id, kb_id, final=True
        )
        shared = [t.index for t in targets if t.index not in own]
        if shared:
            delete_kb_chunks(self.client, ",".join(shared), tenant_id, kb_id)

    def start_reembed(self, tenant_id: str, kb_id: str, model: str) -> KbView:
        """Mark the KB and hand the reembed to a worker (workers/reembed.py); CONFLICT if one runs."""
        self._check_servable(model)

        def mark(kb: KnowledgeBase) -> KnowledgeBase:
            if kb.reembed is not None:
                raise RaglineError(
                    f"knowledge base '{kb_id}' is already being re-embedded (to '{kb.reembed.model}')",
                    code=ErrorCode.CONFLICT,
                )
            kb.reembed, kb.reembed_error = Reembed(model=model), None
            return kb

        self.registry.update_kb(tenant_id, kb_id, mark)
        enqueue(
            self.ingestor.sender,
            self.settings,
            REEMBED_TASK,
            kwargs={"tenant_id": tenant_id, "kb_id": kb_id, "model": model},
            queue=fairqueue.BULK_QUEUE,
        )
        return self.get_kb(tenant_id, kb_id)

    def readable_kb_ids(self, tenant_id: str, requested: list[str] | None) -> list[str]:
        """The caller's KBs among those requested (all when None); an unknown id is NOT_FOUND."""
        if requested is None:
            return sorted(kb.kb_id for kb in self.registry.list_kbs(tenant_id))
        own = self.registry.existing_kb_ids(tenant_id, list(dict.fromkeys(requested)))
        missing = [kb for kb in requested if kb not in own]
        if missing:
            raise RaglineError(f"knowledge base '{missing[0]}' not found", code=ErrorCode.NOT_FOUND)
        return list(dict.fromkeys(requested))

    def get_document(self, tenant_id: str, kb_id: str, doc_id: str) -> dict[str, Any]:
        self.registry.get_kb(tenant_id, kb_id)
        return document_view(self.registry.require_doc(tenant_id, kb_id, doc_id).doc)

    def document_status(self, tenant_id: str, kb_id: str, doc_id: str) -> DocumentStatus:
        view = self.get_document(tenant_id, kb_id, doc_id)
        return DocumentStatus.model_validate({k: view.get(k) for k in DocumentStatus.model_fields})

    def read_chunks(
        self, tenant_id: str, kb_id: str, doc_id: str, chunk_idx: int | None, window: int
    ) -> DocumentText:
        """A chunk and its neighbours (or the first chunks in order) of the document's active version."""
        self.registry.get_kb(tenant_id, kb_id)
        doc = self.registry.require_doc(tenant_id, kb_id, doc_id).doc
        if doc.active_generation is None or doc.status in (DocStatus.DELETING, DocStatus.DELETED):
            raise RaglineError(f"document '{doc_id}' has no searchable version yet", code=ErrorCode.NOT_FOUND)
        index = resolve_one(self.client, self.settings, tenant_id, kb_id).alias
        sources = read_chunks(
            self.client, index, tenant_id, kb_id, doc_id, doc.active_generation, chunk_idx, window
        )
        chunks = [ChunkView.model_validate(source) for source in sources]
        return DocumentText(
            kb_id=kb_id, doc_id=doc_id, title=doc.title, total_chunks=doc.chunk_count, chunks=chunks
        )

    def list_documents(
        self,
        tenant_id: str,
        kb_id: str,
        status: DocStatus | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> DocumentPage:
        self.registry.get_kb(tenant_id, kb_id)
        filters: list[dict[str, Any]] = [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}]
        if status is not None:
            filters.append({"term": {"status": status.value}})
        hits = self.registry.search_docs(
            {"bool": {"filter": filters}},
            size=limit + 1,
            sort=[{"doc_id": "asc"}],
            search_after=_decode_cursor(cursor) if cursor else None,
        )
        page = hits[:limit]
        docs = [document_view(Document.model_validate(h["_source"])) for h in page]
        following = _encode_cursor(page[-1]["sort"]) if len(hits) > limit else None
        return DocumentPage(documents=docs, next_cursor=following)

    def batch(self, tenant_id: str, batch_id: str) -> BatchView:
        """A batch's documents by status. A source run's batch is the run's id: it is found while
        the run has submitted nothing (or never does), and not done before the run has ended."""
        run = self.sources.tenant_run(tenant_id, batch_id)
        if run is not None and not run.status.active:
            # What the run sent just before it ended counts too: unsearchable yet, the batch read
            # done without it.
            self.registry.refresh_docs()
        total, counts = self.registry.batch_counts(tenant_id, batch_id)
        if total == 0 and run is None:
            raise RaglineError(f"batch '{batch_id}' not found", code=ErrorCode.NOT_FOUND)
        failed = self.registry.batch_failures(tenant_id, batch_id)
        failures = [
            {
                "kb_id": h["_source"]["kb_id"],
                "doc_id": h["_source"]["doc_id"],
                "error": h["_source"].get("error"),
            }
            for h in failed
        ]
        done = sum(counts.get(s, 0) for s in TERMINAL) == total and (run is None or not run.status.active)
        return BatchView(batch_id=batch_id, total=total, counts=counts, done=done, failures=failures)

"""Submitting documents: the one entry point every front (REST, MCP, CLI) uses.

The bytes are stored durably first, then the registry records the document as `queued`, then
the first stage is enqueued. If the enqueue is lost (broker down), the record stays `queued`
with an expired lease and the reconciler sends it again, so an accepted document is never lost.

A document given by URL is recorded the same way, with its URL instead of bytes: its first stage
is fetch (workers/stages/fetch.py), which the worker runs under the SSRF policy
(shared/fetch/policy.py; here only what the URL itself says is checked, since a host name means
nothing until the worker resolves it).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import redis
from celery import Celery
from opensearchpy.exceptions import TransportError

from shared import erasure, fairqueue, tracing
from shared.admission import Admission, Admitter
from shared.blob_sharing import SharedBlobs
from shared.blobs import BlobStore
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError, TransientError
from shared.fetch.policy import FetchPolicy, check_url, doc_id_for_url, name_of
from shared.metadata_rules import check_metadata
from shared.models import (
    DocStatus,
    Document,
    Outcome,
    Stage,
    check_doc_id,
    entry_stage,
    file_label,
    safe_doc_id,
    utcnow,
)
from shared.queue import enqueue, stage_queue
from shared.registry import Conflict, NotFound, Registry, Versioned

log = logging.getLogger(__name__)

STAGE_TASK = "ragline.stage"
QUEUE_LEASE = timedelta(minutes=30)


@dataclass(frozen=True)
class SubmitResult:
    doc_id: str
    outcome: Outcome
    status: DocStatus
    content_version: int


def text_filename(doc_id: str | None) -> str | None:
    """The filename of a document sent as text without one: its doc_id's last part, which its
    title and search hits show (the type comes from the bytes; a name refines it only within text
    types). Without a doc_id, none: the id then comes from the content's hash, where one fixed
    name made every such text replace the last one."""
    return (posixpath.basename(doc_id) or None) if doc_id is not None else None


@dataclass(frozen=True)
class Upload:
    """One document of a request: its bytes (or a stream of them), or the URL the worker fetches
    them from, and what the caller said of it."""

    data: bytes | Iterable[bytes]
    filename: str | None = None
    mime_type: str | None = None
    doc_id: str | None = None
    size: int | None = None  # known before reading (a spooled multipart file), else None
    url: str | None = None  # instead of data: fetched by the worker

    @classmethod
    def of_url(cls, url: str, doc_id: str | None = None) -> Upload:
        return cls(b"", doc_id=doc_id, url=url)

    @property
    def known_size(self) -> int | None:
        return len(self.data) if isinstance(self.data, bytes) else self.size


@dataclass(frozen=True)
class StageRef:
    """What a stage task needs to find its document: small, so the broker never carries content."""

    tenant_id: str
    kb_id: str
    doc_id: str
    content_version: int
    stage: Stage

    def as_kwargs(self) -> dict[str, Any]:
        return {
            "tenant_id": self.tenant_id,
            "kb_id": self.kb_id,
            "doc_id": self.doc_id,
            "content_version": self.content_version,
            "stage": self.stage.value,
        }


class Ingestor:
    """Accepts documents into knowledge bases and starts their pipeline."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        blobs: BlobStore,
        sender: Celery,
        broker: redis.Redis,
        source_exists: Callable[[str, str, str], bool] = lambda *_: True,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.broker = broker
        self.client = registry.client
        self.blobs = blobs
        self.sender = sender
        self.admitter = Admitter(settings, registry, broker)
        self.shared_blobs = SharedBlobs(blobs, broker, settings.celery.worker_silent_s)
        # Whether a source (tenant, KB, id) still stands: a document one forgotten kept is an upload's.
        self.source_exists = source_exists
        self.fetch_policy = FetchPolicy.of(settings.fetch.allow)

    @property
    def fetch_limit(self) -> int:
        """The most bytes a URL may bring: what admission counts it as."""
        return min(self.settings.fetch.max_bytes, self.settings.api.max_file_bytes)

    def submit(
        self,
        tenant_id: str,
        kb_id: str,
        data: bytes | Iterable[bytes],
        *,
        filename: str | None = None,
        mime_type: str | None = None,
        doc_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        source_uri: str | None = None,
        source_id: str | None = None,
        batch_id: str | None = None,
        priority: str | None = None,
        size: int | None = None,
    ) -> SubmitResult:
        """Admit one document, store its bytes, register it and start its pipeline."""
        upload = Upload(data, filename=filename, mime_type=mime_type, doc_id=doc_id, size=size)
        return self.submit_many(
            tenant_id,
            kb_id,
            [upload],
            metadata=metadata,
            source_uri=source_uri,
            source_id=source_id,
            batch_id=batch_id,
            priority=priority,
        )[0]

    def submit_many(
        self,
        tenant_id: str,
        kb_id: str,
        uploads: list[Upload],
        *,
        metadata: dict[str, Any] | None = None,
        source_uri: str | None = None,
        source_id: str | None = None,
        batch_id: str | None = None,
        priority: str | None = None,
    ) -> list[SubmitResult]:
        """Admit a request's documents (shared/admission.py), then store, register and start each.

        Everything that can refuse the request (unknown KB, metadata out of bounds, a bad doc_id,
        a known size over the limit, a URL that is malformed or names an address the fetch policy
        refuses, the tenant's bounds) is checked before the first byte is stored, so a refused
        request leaves nothing behind. `priority` is what the caller asked for; admission
        decides; a URL counts as the most it may bring (`fetch_limit`).
        """
        self.registry.get_kb(tenant_id, kb_id)  # NOT_FOUND before any byte is stored
        metadata = check_metadata(metadata or {}, self.settings.api.max_metadata_bytes)
        limit = self.settings.api.max_file_bytes
        for number, upload in enumerate(uploads, start=1):
            if upload.url is not None:
                self.fetch_policy.check_name(check_url(upload.url))
            if upload.doc_id is not None:
                check_doc_id(upload.doc_id)
            elif upload.url is not None:
                check_doc_id(doc_id_for_url(upload.url))
            if upload.known_size is not None and upload.known_size > limit:
                raise RaglineError(
                    f"document {number} of the request exceeds the limit of {limit} bytes",
                    code=ErrorCode.TOO_LARGE,
                    details={"limit": limit, "document": number},
                )
        if any(upload.url is None for upload in uploads):
            self.shared_blobs.check()
        sizes = [self.fetch_limit if u.url is not None else u.known_size for u in uploads]
        admission = self.admitter.admit(tenant_id, priority, sizes)
        results: list[SubmitResult] = []
        try:
            for upload in uploads:
                results.append(
                    self._store_and_register(
                        tenant_id, kb_id, upload, metadata, (source_uri, source_id), batch_id, admission
                    )
                )
        finally:
            if not any(r.outcome != Outcome.UNCHANGED for r in results):
                self.admitter.release(admission, tenant_id)
        return results

    def _store_and_register(
        self,
        tenant_id: str,
        kb_id: str,
        upload: Upload,
        metadata: dict[str, Any],
        source: tuple[str | None, str | None],
        batch_id: str | None,
        admission: Admission,
    ) -> SubmitResult:
        """`source` is the document's provenance: where it came from (a URI) and the source that
        brought it, if one did (shared/sources)."""
        source_uri, source_id = source
        if upload.url is not None:
            doc_id = upload.doc_id or doc_id_for_url(upload.url)
            return self._register_url(tenant_id, kb_id, doc_id, upload.url, metadata, batch_id, admission)
        blob = self.blobs.put(upload.data, max_bytes=self.settings.api.max_file_bytes)
        # Whichever front it came through (a form, JSON, an MCP call), the name kept is a label;
        # the id comes from the name as given, whose path segments it keeps (safely).
        filename = file_label(upload.filename) if upload.filename else None
        final_id = upload.doc_id or safe_doc_id(upload.filename or f"doc-{blob.sha256[:16]}")
        try:
            for _ in range(5):
                try:
                    return self._register_pinned(
                        tenant_id,
                        kb_id,
                        final_id,
                        blob.sha256,
                        blob.size,
                        filename,
                        upload.mime_type,
                        metadata,
                        (source_uri or filename, source_id),
                        batch_id,
                        admission,
                    )
                except Conflict:
                    continue  # someone else wrote the record in between: read it again
            raise RaglineError(
                f"document '{final_id}' is being changed concurrently", code=ErrorCode.CONFLICT
            )
        except Exception:
            self._release_unregistered(blob.sha256)
            raise

    def _release_unregistered(self, sha256: str) -> None:
        """The bytes of an upload that wrote no record go, unless a record needs them. Where the
        failure was the store's or the registry's, this may fail too: the bytes then stay, and
        the client's retry of the same content stores them again as the same blob."""
        try:
            erasure.release_blob(self.registry, self.blobs, sha256)
        except (TransientError, TransportError) as error:  # the store, its locks or OpenSearch is out
            log.warning("the bytes %s of a failed upload stay in the blob store: %s", sha256, error)
        except Exception:  # the upload's own failure is what the caller hears
            log.warning("the bytes %s of a failed upload stay in the blob store", sha256, exc_info=True)

    def _register(
        self,
        tenant_id: str,
        kb_id: str,
        doc_id: str,
        sha256: str,
        size: int,
        filename: str | None,
        mime_type: str | None,
        metadata: dict[str, Any],
        source: tuple[str | None, str | None],
        batch_id: str | None,
        admission: Admission,
    ) -> SubmitResult:
        source_uri, source_id = source
        current = self.registry.get_doc(tenant_id, kb_id, doc_id)
        if current is not None:
            check_owner(current.doc, source_id, self.source_exists)
        if current is not None and _unchanged(current.doc, sha256, metadata):
            return SubmitResult(doc_id, Outcome.UNCHANGED, current.doc.status, current.doc.content_version)
        now = utcnow()
        doc = Document(
            tenant_id=tenant_id,
            kb_id=kb_id,
            doc_id=doc_id,
            content_hash=sha256,
            file_size=size,
            filename=filename,
            mime_type=mime_type,
            source_uri=source_uri,
            source_id=source_id,
            metadata=metadata,
            batch_id=batch_id,
            queue=admission.queue,
            lease_until=now + QUEUE_LEASE,
            transitions=[{"status": DocStatus.QUEUED.value, "at": now.isoformat()}],
            trace=tracing.carrier(),
        )
        if current is None:
            doc.outcome = Outcome.CREATED
            stored = self.registry.create_doc(doc)
        else:
            previous = current.doc
            doc.content_version = previous.content_version + 1
            # Readers keep seeing the previous version's chunks until the new one is ready.
            doc.active_generation = previous.active_generation
            doc.chunk_count = previous.chunk_count
            doc.created_at = previous.created_at
            doc.outcome = Outcome.CREATED if previous.status == DocStatus.DELETED else Outcome.UPDATED
            stored = self.registry.replace_doc(current, doc)
        outcome = doc.outcome
        self._kb_stands(stored.doc, bytes_pinned=True)
        self.admitter.hold(admission, tenant_id, kb_id, doc_id, doc.content_version)
        self._start(stored)
        return SubmitResult(doc_id, outcome, DocStatus.QUEUED, doc.content_version)

    def _register_url(
        self,
        tenant_id: str,
        kb_id: str,
        doc_id: str,
        url: str,
        metadata: dict[str, Any],
        batch_id: str | None,
        admission: Admission,
    ) -> SubmitResult:
        """Record a new version whose bytes the worker fetches from `url` (see `url_version`)."""
        for _ in range(5):
            current = self.registry.get_doc(tenant_id, kb_id, doc_id)
            if current is not None:
                check_owner(current.doc, None, self.source_exists)  # a URL is an upload
            now = utcnow()
            previous = current.doc if current is not None else None
            doc, released = url_version(previous, tenant_id, kb_id, doc_id, url, metadata)
            doc.queue, doc.batch_id = admission.queue, batch_id
            doc.lease_until = now + QUEUE_LEASE
            doc.trace = tracing.carrier()
            queued = {"status": DocStatus.QUEUED.value, "at": now.isoformat()}
            doc.transitions = [*doc.transitions, queued][-64:]
            try:
                if current is None:
                    stored = self.registry.create_doc(doc)
                else:
                    stored = self.registry.replace_doc(current, doc)
            except Conflict:
                continue
            if released is not None:
                erasure.release_blob(self.registry, self.blobs, released)
            self._kb_stands(stored.doc)
            self.admitter.hold(admission, tenant_id, kb_id, doc_id, doc.content_version)
            self._start(stored)
            assert doc.outcome is not None
            return SubmitResult(doc_id, doc.outcome, DocStatus.QUEUED, doc.content_version)
        raise RaglineError(f"document '{doc_id}' is being changed concurrently", code=ErrorCode.CONFLICT)

    def reingest(
        self, tenant_id: str, kb_id: str, doc_id: str, *, batch_id: str | None = None
    ) -> SubmitResult:
        """Run the pipeline again from the stored bytes (after a fix, or new KB settings); a
        document by URL whose bytes were never fetched is fetched. `batch_id`: the batch it joins
        (a source run's); by default it stays in its own.

        It is admitted like an upload of the same size (shared/admission.py).
        """
        found = self.registry.require_doc(tenant_id, kb_id, doc_id)
        admission = self.admitter.admit(tenant_id, None, [found.doc.file_size])
        try:
            return self._reingest(tenant_id, kb_id, doc_id, admission, batch_id)
        except BaseException:
            self.admitter.release(admission, tenant_id)
            raise

    def _reingest(
        self, tenant_id: str, kb_id: str, doc_id: str, admission: Admission, batch_id: str | None
    ) -> SubmitResult:
        for _ in range(5):
            current = self.registry.require_doc(tenant_id, kb_id, doc_id)
            previous = current.doc
            if previous.status in (DocStatus.DELETING, DocStatus.DELETED):
                raise RaglineError(f"document '{doc_id}' was deleted", code=ErrorCode.NOT_FOUND)
            now = utcnow()
            doc = previous.model_copy(deep=True)
            doc.content_version += 1
            doc.queue = admission.queue
            doc.trace = tracing.carrier()
            doc.batch_id = batch_id or doc.batch_id
            doc.status, doc.stage, doc.progress, doc.attempts, doc.error = (
                DocStatus.QUEUED,
                Stage.FETCH if doc.url and not doc.content_hash else None,
                0.0,
                0,
                None,
            )
            doc.outcome = Outcome.UPDATED
            doc.claimed_by, doc.lease_until = None, now + QUEUE_LEASE
            doc.transitions = [*doc.transitions, {"status": DocStatus.QUEUED.value, "at": now.isoformat()}][
                -64:
            ]
            try:
                stored = self.registry.replace_doc(current, doc)
            except Conflict:
                continue
            self._kb_stands(stored.doc)
            self.admitter.hold(admission, tenant_id, kb_id, doc_id, doc.content_version)
            self._start(stored)
            return SubmitResult(doc_id, Outcome.UPDATED, DocStatus.QUEUED, doc.content_version)
        raise RaglineError(f"document '{doc_id}' is being changed concurrently", code=ErrorCode.CONFLICT)

    def delete(self, tenant_id: str, kb_id: str, doc_id: str) -> Document:
        """Remove a document's chunks from both search paths, its stage artifacts and the bytes no
        other live record needs (shared/erasure.py), and mark it `deleted`.

        The content version is bumped first, so any stage still running for the document finds
        itself superseded and writes nothing.
        """
        for _ in range(5):
            current = self.registry.require_doc(tenant_id, kb_id, doc_id)
            doc = current.doc.model_copy(deep=True)
            if doc.status == DocStatus.DELETED:
                return doc
            doc.content_version += 1
            doc.status = DocStatus.DELETING
            doc.claimed_by = None
            doc.lease_until = utcnow() + QUEUE_LEASE
            doc.transitions = [
                *doc.transitions,
                {"status": DocStatus.DELETING.value, "at": utcnow().isoformat()},
            ]
            try:
                deleting = self.registry.replace_doc(current, doc)
                break
            except Conflict:
                continue
        else:
            raise RaglineError(f"document '{doc_id}' is being changed concurrently", code=ErrorCode.CONFLICT)
        return erasure.finish_delete(
            self.settings, self.registry, self.client, self.blobs, self.broker, deleting
        )

    def _register_pinned(
        self, tenant_id: str, kb_id: str, doc_id: str, sha256: str, *rest: Any
    ) -> SubmitResult:
        """`_register`, the bytes pinned until the record is written (a delete that shares them
        removes them before or not at all); then the bytes of the version it replaced go, unless
        another record still needs them."""
        before = self.registry.get_doc(tenant_id, kb_id, doc_id)
        try:
            with self.blobs.pinned(sha256):
                if not self.blobs.exists(sha256):  # a delete of the same bytes removed them just now
                    raise TransientError("the upload met a delete of the same content; send it again")
                result = self._register(tenant_id, kb_id, doc_id, sha256, *rest)
        except NotFound:
            # Its knowledge base is gone (`_kb_stands`): so are these bytes, unless a record needs them.
            erasure.release_blob(self.registry, self.blobs, sha256)
            raise
        replaced = before.doc.content_hash if before is not None else None
        if result.outcome != Outcome.UNCHANGED and replaced not in (None, "", sha256):
            erasure.release_blob(self.registry, self.blobs, replaced)
        return result

    def _kb_stands(self, doc: Document, *, bytes_pinned: bool = False) -> None:
        """NOT_FOUND, the version just written taken back, when its knowledge base was deleted
        meanwhile: the deletion's last sweep of the KB's records may have run before this write
        (shared/catalog.py `delete_kb`), and the record would outlive the KB and show in a new KB
        of the same id. Its bytes go too, unless a record needs them; bytes this call holds
        pinned go once the pin is released (`_store_and_register`)."""
        try:
            self.registry.get_kb(doc.tenant_id, doc.kb_id)
        except NotFound:
            self.registry.drop_doc(doc)
            if not bytes_pinned:
                erasure.release_blob(self.registry, self.blobs, doc.content_hash)
            raise

    def _start(self, stored: Versioned) -> None:
        doc = stored.doc
        ref = StageRef(doc.tenant_id, doc.kb_id, doc.doc_id, doc.content_version, entry_stage(doc))
        try:
            if doc.queue == fairqueue.BULK_QUEUE:
                fairqueue.push(self.broker, doc.tenant_id, doc.kb_id, STAGE_TASK, ref.as_kwargs())
            else:
                queue = stage_queue(self.settings, doc.queue, ref.stage)
                enqueue(self.sender, self.settings, STAGE_TASK, kwargs=ref.as_kwargs(), queue=queue)
        except Exception:  # noqa: BLE001  (broker down, any error type: the reconciler re-sends)
            log.warning("enqueue failed for %s/%s; the reconciler will retry", doc.kb_id, doc.doc_id)
            hand_to_reconciler(self.registry, ref)


class NotOwner(RaglineError):
    """A document of a source is changed only by that source, and a source takes no other's."""

    code = ErrorCode.CONFLICT


def check_owner(doc: Document, source_id: str | None, source_exists: Callable[[str, str, str], bool]) -> None:
    """NotOwner unless `source_id` (None: an upload) may replace `doc`: the same source, or one
    that is deleted (its id is free again). An upload may replace a document whose source is gone
    (forgotten with its documents kept, and theirs not yet released as uploads')."""
    if doc.status in (DocStatus.DELETED, DocStatus.DELETING) or doc.source_id == source_id:
        return
    if source_id is None and doc.source_id and not source_exists(doc.tenant_id, doc.kb_id, doc.source_id):
        return
    owner = f"source '{doc.source_id}'" if doc.source_id else "an upload"
    raise NotOwner(
        f"document '{doc.doc_id}' belongs to {owner}; give another doc_id (a source: a doc_id_prefix)"
    )


def url_version(
    previous: Document | None, tenant_id: str, kb_id: str, doc_id: str, url: str, metadata: dict[str, Any]
) -> tuple[Document, str | None]:
    """The record of a new version fetched from `url` (queued at its entry stage, fetch), and the
    bytes of `previous` it no longer names (None: none to release).

    Ingested again, a ready document keeps its bytes (and their validators, when the URL is the
    same) as the baseline the fetch compares with: the same bytes, or a 304, end the version
    `unchanged`. New metadata, or any state but ready, leaves no baseline: the fetched bytes go
    through the pipeline whatever they are. Metadata not given is kept.
    """
    released = None
    if previous is None or previous.status in (DocStatus.DELETED, DocStatus.DELETING):
        existed = previous is not None and previous.status == DocStatus.DELETING
        doc = Document(
            tenant_id=tenant_id,
            kb_id=kb_id,
            doc_id=doc_id,
            content_hash="",
            file_size=0,
            metadata=metadata,
            outcome=Outcome.UPDATED if existed else Outcome.CREATED,
        )
        if previous is not None:
            doc.content_version = previous.content_version + 1
            doc.created_at = previous.created_at
    else:
        doc = previous.model_copy(deep=True)
        doc.content_version += 1
        doc.metadata = metadata or previous.metadata
        doc.outcome = Outcome.UPDATED
        doc.progress, doc.attempts, doc.error, doc.claimed_by = 0.0, 0, None, None
        if previous.url != url:
            doc.fetch = None  # its validators are another URL's
        baseline = previous.status == DocStatus.READY and doc.metadata == previous.metadata
        if not baseline and previous.content_hash:
            released = previous.content_hash
            doc.content_hash, doc.file_size, doc.fetch = "", 0, None
    doc.url = doc.source_uri = url
    doc.filename = name_of(url)
    doc.status, doc.stage = DocStatus.QUEUED, Stage.FETCH
    return doc, released


def hand_to_reconciler(registry: Registry, ref: StageRef) -> None:
    """After a failed send: expire the document's lease, so the next reconciler round sends it.

    Without this the document would wait out its whole queue lease (a broker restart would cost
    half an hour); best effort, since the lease expires on its own anyway.
    """
    try:
        current = registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
        if current is None or current.doc.content_version != ref.content_version or current.doc.claimed_by:
            return
        registry.replace_doc(current, current.doc.model_copy(update={"lease_until": utcnow()}))
    except Exception:  # noqa: BLE001  (superseded, or OpenSearch down too: the lease still expires)
        log.info("could not hand %s/%s to the reconciler", ref.kb_id, ref.doc_id)


# Failures that the same bytes would meet again; others (outages, timeouts, bugs) deserve a retry.
_FINAL_FAILURES = {
    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    ErrorCode.PARSE_ERROR,
    ErrorCode.EMPTY_DOCUMENT,
    ErrorCode.TOO_LARGE,
    ErrorCode.PII_BLOCKED,
}


def _unchanged(doc: Document, sha256: str, metadata: dict[str, Any]) -> bool:
    """Same bytes and metadata, and nothing a new attempt could change: submit does no work."""
    if doc.content_hash != sha256 or doc.status in (DocStatus.DELETED, DocStatus.DELETING):
        return False
    if doc.status == DocStatus.FAILED and (doc.error is None or doc.error.code not in _FINAL_FAILURES):
        return False
    return not metadata or metadata == doc.metadata

"""Durable, content-addressed storage of the accepted bytes and of stage artifacts: the interface.

Two stores implement it, chosen once in shared/wiring.py: a directory of this host
(shared/blob_dir.py, the default) and a bucket of an S3-compatible store (shared/blob_s3.py), which
an API and workers on separate hosts share. A reader never sees a partial blob, and an accepted
document survives a crash right after submit returns.

Blobs are shared: the same bytes in two documents (or knowledge bases) are one blob. One is
removed only when no live record needs it (shared/erasure.py decides), under a lock that a
submit holds, shared, from storing the bytes until its record is written (`pinned`): a delete
can neither remove bytes that a record about to be written needs, nor miss that record. The lock
is per stripe (the blobs whose digest starts with the same byte), across every process that
shares the store.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from shared.errors import ErrorCode, RaglineError
from shared.models import PIPELINE, Document

# A pin lasts one registry write, a removal one registry search: waiting longer means something
# is stuck, and the caller is told to retry rather than wait without end.
LOCK_WAIT_S = 30.0
# The object (or file) that names a store (`BlobStore.identity`), beside its blobs and artifacts.
IDENTITY_NAME = "store-id"
IDENTITY_MAX_CHARS = 64  # what of it is read: an id is 32, and whatever else is there is not one


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int


class BlobTooLarge(RaglineError):
    code = ErrorCode.TOO_LARGE


def record_stamp(created_at: datetime) -> str:
    """Which record of a document id an artifact belongs to: the record's creation time, in
    microseconds. A knowledge base deleted and created again holds new records of the same ids
    and versions, and a stage of an old record still at work must neither overwrite nor be read
    for the new one's."""
    return format(round(created_at.timestamp() * 1_000_000), "x")


def artifact_key(doc: Document, version: int, stage: str) -> str:
    """The key of what `stage` handed on for one version of the document's record."""
    return f"{doc.tenant_id}/{doc.kb_id}/{doc.doc_id}/{record_stamp(doc.created_at)}/v{version}/{stage}"


def unstamped_artifact_key(doc: Document, version: int, stage: str) -> str:
    """The key of a stage's artifact written before keys named the record: read only for a
    document that was in the pipeline across the upgrade, and dropped with the stamped ones."""
    return f"{doc.tenant_id}/{doc.kb_id}/{doc.doc_id}/v{version}/{stage}"


def version_artifact_keys(doc: Document, versions: Iterable[int]) -> list[str]:
    """The keys of every stage's artifact of these versions of the document's record."""
    keys = []
    for version in versions:
        for stage in PIPELINE:
            keys.append(artifact_key(doc, version, stage.value))
            keys.append(unstamped_artifact_key(doc, version, stage.value))
    return keys


def new_identity() -> str:
    return uuid.uuid4().hex


def checked_digest(sha256: str) -> str:
    """The digest itself; ValueError for anything that is not a sha256 hex digest (never a path)."""
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError("not a sha256 hex digest")
    return sha256


def artifact_name(key: str) -> str:
    """Where an artifact lies: named by its key's digest, so no key reaches a path or an object name."""
    name = hashlib.sha256(key.encode()).hexdigest()
    return f"{name[:2]}/{name}.json"


def spool(data: bytes | Iterable[bytes], out: IO[bytes], max_bytes: int | None) -> StoredBlob:
    """Write bytes (or a stream of byte chunks) to `out`, hashing while writing; enforces max_bytes."""
    parts: Iterable[bytes] = [data] if isinstance(data, bytes) else data
    digest = hashlib.sha256()
    size = 0
    for part in parts:
        size += len(part)
        if max_bytes is not None and size > max_bytes:
            raise BlobTooLarge(f"file exceeds the limit of {max_bytes} bytes", details={"limit": max_bytes})
        digest.update(part)
        out.write(part)
    return StoredBlob(sha256=digest.hexdigest(), size=size)


class BlobStore(abc.ABC):
    """Blobs by sha256, artifacts by key; the pin/remove protocol is the same for every store."""

    @abc.abstractmethod
    def put(self, data: bytes | Iterable[bytes], *, max_bytes: int | None = None) -> StoredBlob:
        """Store bytes (or a stream of byte chunks), hashing while writing; enforces max_bytes.
        The blob becomes visible whole or not at all."""

    @abc.abstractmethod
    def exists(self, sha256: str) -> bool: ...

    @abc.abstractmethod
    def read(self, sha256: str) -> bytes:
        """The blob's bytes; FileNotFoundError when there is none."""

    @abc.abstractmethod
    def local_file(self, sha256: str) -> contextlib.AbstractContextManager[Path]:
        """A file of this host with the blob's bytes, for as long as the context lasts (parsers
        read files); FileNotFoundError when there is none."""

    @abc.abstractmethod
    def put_artifact(self, key: str, value: Any) -> None:
        """Store a JSON artifact handed from one stage to the next (whole or not at all)."""

    @abc.abstractmethod
    def get_artifact(self, key: str) -> Any:
        """The artifact; FileNotFoundError when there is none."""

    @abc.abstractmethod
    def has_artifact(self, key: str) -> bool: ...

    @abc.abstractmethod
    def drop_artifacts(self, keys: Iterable[str]) -> None: ...

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the store is (a directory, a bucket and prefix), for an operator's log line."""

    @abc.abstractmethod
    def identity(self) -> str:
        """The store's id: written by the first process to ask, read by every other that shares
        the store (shared/blob_sharing.py compares a front's with its workers')."""

    @abc.abstractmethod
    def check(self) -> None:
        """Raise a RaglineError saying what is wrong when the store cannot serve now (a readiness
        probe asks; a bucket that does not exist is named)."""

    @abc.abstractmethod
    def _stripe_lock(self, stripe: str, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        """The lock on a stripe across every process of the store; TransientError after LOCK_WAIT_S."""

    @abc.abstractmethod
    def _remove(self, sha256s: set[str]) -> None:
        """Delete these blobs (the caller holds their stripes exclusively); absent ones are fine."""

    def pinned(self, sha256: str) -> contextlib.AbstractContextManager[None]:
        """Hold the blob against removal (shared: many pins of one blob go together)."""
        return self._stripe_lock(checked_digest(sha256)[:2], exclusive=False)

    def remove_unused(self, sha256s: Iterable[str], needed: Callable[[list[str]], set[str]]) -> set[str]:
        """Remove the blobs that `needed(blobs)` does not name as needed by a live record, asked
        with no pin held on any of them: a submit either wrote its record before (and `needed`
        sees it) or stores its bytes again after. Returns the blobs removed."""
        wanted = sorted({checked_digest(sha) for sha in sha256s})
        with contextlib.ExitStack() as held:
            # Stripe by stripe in one order, so two removals never wait on each other; pins never nest.
            for stripe in sorted({sha[:2] for sha in wanted}):
                held.enter_context(self._stripe_lock(stripe, exclusive=True))
            unused = set(wanted) - needed(wanted) if wanted else set()
            if unused:
                self._remove(unused)
            return unused

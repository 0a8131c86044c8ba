"""Durable, content-addressed storage of the accepted bytes and of stage artifacts.

A blob is written to a temporary file, flushed to disk and renamed into place, so a reader
never sees a partial blob and an accepted document survives a crash right after submit returns.

Blobs are shared: the same bytes in two documents (or knowledge bases) are one blob. One is
removed only when no live record needs it (shared/erasure.py decides), under a lock that a
submit holds, shared, from storing the bytes until its record is written (`pinned`): a delete
can neither remove bytes that a record about to be written needs, nor miss that record.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import ErrorCode, RaglineError, TransientError
from shared.models import PIPELINE

_CHUNK = 1 << 20
# A pin lasts one registry write, a removal one registry search: waiting longer means something
# is stuck, and the caller is told to retry rather than wait without end.
_LOCK_WAIT_S = 30.0
_LOCK_POLL_S = 0.01


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int
    path: Path


class BlobTooLarge(RaglineError):
    code = ErrorCode.TOO_LARGE


def artifact_key(tenant_id: str, kb_id: str, doc_id: str, version: int, stage: str) -> str:
    """The key of what `stage` handed on for one version of a document."""
    return f"{tenant_id}/{kb_id}/{doc_id}/v{version}/{stage}"


def version_artifact_keys(tenant_id: str, kb_id: str, doc_id: str, versions: Iterable[int]) -> list[str]:
    """The keys of every stage's artifact of these versions of a document."""
    return [
        artifact_key(tenant_id, kb_id, doc_id, version, stage.value)
        for version in versions
        for stage in PIPELINE
    ]


class BlobStore:
    """Blobs under `root/blobs/ab/cd/<sha256>`, artifacts under `root/artifacts/<key>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "blobs"
        self._artifacts = root / "artifacts"
        self._tmp = root / "tmp"
        self._locks = root / "locks"
        for directory in (self._blobs, self._artifacts, self._tmp, self._locks):
            directory.mkdir(parents=True, exist_ok=True)

    def path_of(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ValueError("not a sha256 hex digest")
        return self._blobs / sha256[:2] / sha256[2:4] / sha256

    def put(self, data: bytes | Iterable[bytes], *, max_bytes: int | None = None) -> StoredBlob:
        """Store bytes (or a stream of byte chunks), hashing while writing; enforces max_bytes."""
        parts: Iterable[bytes] = [data] if isinstance(data, bytes) else data
        digest = hashlib.sha256()
        size = 0
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out:
                for part in parts:
                    size += len(part)
                    if max_bytes is not None and size > max_bytes:
                        raise BlobTooLarge(
                            f"file exceeds the limit of {max_bytes} bytes", details={"limit": max_bytes}
                        )
                    digest.update(part)
                    out.write(part)
                out.flush()
                os.fsync(out.fileno())
            sha = digest.hexdigest()
            final = self.path_of(sha)
            final.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, final)
            _fsync_dir(final.parent)
            return StoredBlob(sha256=sha, size=size, path=final)
        finally:
            tmp.unlink(missing_ok=True)

    def exists(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def read(self, sha256: str) -> bytes:
        return self.path_of(sha256).read_bytes()

    @contextlib.contextmanager
    def _locked(self, sha256: str, mode: int) -> Iterator[None]:
        """A lock on the blob's stripe (the blobs of its first byte), across processes; closing the
        file releases it."""
        stripe = self.path_of(sha256).parent.parent.name  # a digest, never a path
        fd = os.open(self._locks / f"{stripe}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + _LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise TransientError("the blob store is busy; retry shortly") from None
                    time.sleep(_LOCK_POLL_S)
            yield
        finally:
            os.close(fd)

    def pinned(self, sha256: str) -> contextlib.AbstractContextManager[None]:
        """Hold the blob against removal (shared: many pins of one blob go together)."""
        return self._locked(sha256, fcntl.LOCK_SH)

    def remove_unused(self, sha256s: Iterable[str], needed: Callable[[list[str]], set[str]]) -> set[str]:
        """Remove the blobs that `needed(blobs)` does not name as needed by a live record, asked
        with no pin held on any of them: a submit either wrote its record before (and `needed`
        sees it) or stores its bytes again after. Returns the blobs removed."""
        wanted = sorted(set(sha256s))
        with contextlib.ExitStack() as held:
            # Stripe by stripe in one order, so two removals never wait on each other; pins never nest.
            for first in {sha[:2]: sha for sha in wanted}.values():
                held.enter_context(self._locked(first, fcntl.LOCK_EX))
            unused = set(wanted) - needed(wanted) if wanted else set()
            for sha in unused:
                # Its fan-out directories stay: a put may be about to rename another blob into them.
                self.path_of(sha).unlink(missing_ok=True)
            return unused

    def _artifact_path(self, key: str) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()
        return self._artifacts / name[:2] / f"{name}.json"

    def put_artifact(self, key: str, value: Any) -> None:
        """Store a JSON artifact handed from one stage to the next."""
        path = self._artifact_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(value, out, ensure_ascii=False)
            os.replace(tmp_name, path)
        finally:
            Path(tmp_name).unlink(missing_ok=True)  # a failed write leaves no half of the text behind

    def get_artifact(self, key: str) -> Any:
        path = self._artifact_path(key)
        with path.open(encoding="utf-8") as handle:
            return json.load(handle)

    def has_artifact(self, key: str) -> bool:
        return self._artifact_path(key).is_file()

    def drop_artifacts(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._artifact_path(key).unlink(missing_ok=True)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The blob store in a directory of this host (the default): files under `root`, locks by flock.

A blob is written to a temporary file, flushed to disk and renamed into place, so a reader never
sees a partial blob and an accepted document survives a crash right after submit returns. flock
holds among the processes of this host only: processes on other hosts sharing the directory (NFS)
would not see each other's locks, which is what the S3 store (shared/blob_s3.py) is for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from shared.blobs import (
    IDENTITY_MAX_CHARS,
    IDENTITY_NAME,
    LOCK_WAIT_S,
    BlobStore,
    StoredBlob,
    artifact_name,
    checked_digest,
    new_identity,
    spool,
)
from shared.errors import OutageError, TransientError

log = logging.getLogger(__name__)

_LOCK_POLL_S = 0.01


class DirBlobStore(BlobStore):
    """Blobs under `root/blobs/ab/cd/<sha256>`, artifacts under `root/artifacts/<key digest>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "blobs"
        self._artifacts = root / "artifacts"
        self._tmp = root / "tmp"
        self._locks = root / "locks"
        try:
            self._make_directories()
        except OSError as error:
            # A process starts anyway, to answer UNAVAILABLE (and its readiness to say why) until
            # the store is repaired: each write lays the store out again or meets the fault.
            log.error("the blob store in %s cannot be laid out: %s", root, error)

    def _make_directories(self) -> None:
        for directory in (self._blobs, self._artifacts, self._tmp, self._locks):
            directory.mkdir(parents=True, exist_ok=True)

    def _temp_file(self) -> tuple[int, str]:
        """A new file to write whole, then rename into place; a store whose directory was deleted
        under the running processes is laid out again, not failed on until they restart."""
        try:
            return tempfile.mkstemp(dir=self._tmp)
        except FileNotFoundError:
            self._make_directories()
            return tempfile.mkstemp(dir=self._tmp)

    def path_of(self, sha256: str) -> Path:
        checked_digest(sha256)
        return self._blobs / sha256[:2] / sha256[2:4] / sha256

    def put(self, data: bytes | Iterable[bytes], *, max_bytes: int | None = None) -> StoredBlob:
        with self._unwritable():
            fd, tmp_name = self._temp_file()
            tmp = Path(tmp_name)
            try:
                with os.fdopen(fd, "wb") as out:
                    blob = spool(data, out, max_bytes)
                    out.flush()
                    os.fsync(out.fileno())
                final = self.path_of(blob.sha256)
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, final)
                _fsync_dir(final.parent)
                return blob
            finally:
                tmp.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _unwritable(self) -> Iterator[None]:
        """A disk that is full or failing, or a folder of the store made something else, is an
        outage of the store: the caller is told to retry later, not handed a server error."""
        try:
            yield
        except OSError as error:
            # Its path is for the operator's log: the message reaches the request that met it.
            log.error("the blob store in %s cannot be written: %s", self.root, error)
            raise OutageError("the blob store cannot be written") from error

    def exists(self, sha256: str) -> bool:
        return self.path_of(sha256).is_file()

    def read(self, sha256: str) -> bytes:
        return self.path_of(sha256).read_bytes()

    @contextlib.contextmanager
    def local_file(self, sha256: str) -> Iterator[Path]:
        path = self.path_of(sha256)
        if not path.is_file():
            raise FileNotFoundError(f"no blob {sha256}")
        yield path

    @property
    def location(self) -> str:
        return str(self.root)

    def identity(self) -> str:
        """A link of a written file: of processes creating the store's id at once, one link wins."""
        path = self.root / IDENTITY_NAME
        try:
            if not path.is_file():
                fd, tmp_name = self._temp_file()
                try:
                    with os.fdopen(fd, "w", encoding="ascii") as out:
                        out.write(new_identity())
                    with contextlib.suppress(FileExistsError):
                        os.link(tmp_name, path)
                finally:
                    Path(tmp_name).unlink(missing_ok=True)
            with path.open(encoding="ascii", errors="replace") as written:
                return written.read(IDENTITY_MAX_CHARS).strip()
        except OSError as error:
            # Its path is for the operator's log: the message reaches the request that met it.
            log.error("the blob store's id in %s cannot be read: %s", self.root, error)
            raise OutageError("the blob store's id cannot be read") from error

    def check(self) -> None:
        """A small write as an upload's: a full or read-only disk fails it as it fails uploads."""
        with self._unwritable():
            self._make_directories()  # as a write would, for a store deleted under the processes
            fd, tmp_name = self._temp_file()
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(b"readiness")
                    out.flush()
                    os.fsync(out.fileno())
            finally:
                Path(tmp_name).unlink(missing_ok=True)
        for directory in (self._blobs, self._artifacts, self._locks):
            if not directory.is_dir() or not os.access(directory, os.W_OK | os.X_OK):
                raise OutageError(f"the blob store's directory {directory} is not a writable directory")
            if directory.stat().st_dev != self._tmp.stat().st_dev:
                # A blob is written in tmp/ and renamed into place: across file systems it cannot be.
                raise OutageError(
                    f"the blob store's {self._tmp} and {directory} are on different file systems"
                )

    @contextlib.contextmanager
    def _stripe_lock(self, stripe: str, *, exclusive: bool) -> Iterator[None]:
        """flock on the stripe's lock file; closing the file releases it."""
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        lock = self._locks / f"{stripe}.lock"
        with self._unwritable():
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:
                self._make_directories()  # deleted under the running processes (see `_temp_file`)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + LOCK_WAIT_S
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

    def _remove(self, sha256s: set[str]) -> None:
        for sha in sha256s:
            # Its fan-out directories stay: a put may be about to rename another blob into them.
            self.path_of(sha).unlink(missing_ok=True)

    def _artifact_path(self, key: str) -> Path:
        return self._artifacts / artifact_name(key)

    def put_artifact(self, key: str, value: Any) -> None:
        # json.dumps, not json.dump: only the one-shot call uses the C encoder, and every stage of
        # every document writes its artifact here.
        text = json.dumps(value, ensure_ascii=False)
        path = self._artifact_path(key)
        with self._unwritable():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = self._temp_file()
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(text)
                os.replace(tmp_name, path)
            finally:
                Path(tmp_name).unlink(missing_ok=True)  # a failed write leaves no half of the text behind

    def get_artifact(self, key: str) -> Any:
        with self._artifact_path(key).open(encoding="utf-8") as handle:
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

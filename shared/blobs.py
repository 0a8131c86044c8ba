"""Durable, content-addressed storage of the accepted bytes and of stage artifacts.

A blob is written to a temporary file, flushed to disk and renamed into place, so a reader
never sees a partial blob and an accepted document survives a crash right after submit returns.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import ErrorCode, RaglineError

_CHUNK = 1 << 20


@dataclass(frozen=True)
class StoredBlob:
    sha256: str
    size: int
    path: Path


class BlobTooLarge(RaglineError):
    code = ErrorCode.TOO_LARGE


class BlobStore:
    """Blobs under `root/blobs/ab/cd/<sha256>`, artifacts under `root/artifacts/<key>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._blobs = root / "blobs"
        self._artifacts = root / "artifacts"
        self._tmp = root / "tmp"
        for directory in (self._blobs, self._artifacts, self._tmp):
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

    def _artifact_path(self, key: str) -> Path:
        name = hashlib.sha256(key.encode()).hexdigest()
        return self._artifacts / name[:2] / f"{name}.json"

    def put_artifact(self, key: str, value: Any) -> None:
        """Store a JSON artifact handed from one stage to the next."""
        path = self._artifact_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self._tmp)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(value, out, ensure_ascii=False)
        os.replace(tmp_name, path)

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

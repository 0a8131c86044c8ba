"""The directory blob store when its folders are not what it laid out: a folder made something
else, or a disk that fails a write, is an outage the caller is told about (UNAVAILABLE), never a
server error (a store deleted whole is laid out again: test_blob_sharing.py)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest

from shared.blob_dir import DirBlobStore
from shared.errors import OutageError


@pytest.mark.parametrize("folder", ["tmp", "blobs", "locks", "artifacts"])
def test_a_folder_made_a_file_is_an_outage_for_the_probe(tmp_path: Path, folder: str) -> None:
    store = DirBlobStore(tmp_path / "store")
    shutil.rmtree(store.root / folder)
    (store.root / folder).write_bytes(b"not a folder")
    with pytest.raises(OutageError):
        store.check()


def test_a_temporary_folder_made_a_file_fails_a_put_as_an_outage(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path / "store")
    shutil.rmtree(store.root / "tmp")
    (store.root / "tmp").write_bytes(b"not a folder")
    with pytest.raises(OutageError, match="cannot be written") as raised:
        store.put(b"a document")
    assert str(tmp_path) not in str(raised.value)  # the path is the operator's, in the log
    os.unlink(store.root / "tmp")
    assert store.read(store.put(b"a document").sha256) == b"a document"


def test_a_full_disk_fails_a_put_as_an_outage_and_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DirBlobStore(tmp_path / "store")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutageError):
        store.put(b"a document")
    assert list((store.root / "tmp").iterdir()) == []
    assert [p for p in (store.root / "blobs").rglob("*") if p.is_file()] == []


def test_a_store_broken_at_start_is_made_and_reports_its_fault_later(tmp_path: Path) -> None:
    """A front or a worker started on a broken store ran no further (the API and stdio MCP died,
    a worker never sent its heartbeat); it now starts and answers UNAVAILABLE until repaired."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "tmp").write_bytes(b"not a folder")
    store = DirBlobStore(tmp_path / "store")
    with pytest.raises(OutageError):
        store.check()
    with pytest.raises(OutageError):
        store.put(b"a document")
    os.unlink(tmp_path / "store" / "tmp")
    store.check()
    assert store.read(store.put(b"a document").sha256) == b"a document"


def test_locks_that_cannot_be_taken_are_an_outage(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path / "store")
    blob = store.put(b"a document")
    shutil.rmtree(store.root / "locks")
    (store.root / "locks").write_bytes(b"not a folder")
    with pytest.raises(OutageError), store.pinned(blob.sha256):
        pass
    with pytest.raises(OutageError):
        store.remove_unused([blob.sha256], lambda _: set())
    assert store.exists(blob.sha256)


def test_an_artifact_that_cannot_be_written_is_an_outage(tmp_path: Path) -> None:
    """A worker's stage met it as an unknown error, and the document sat in its stage unexplained."""
    store = DirBlobStore(tmp_path / "store")
    shutil.rmtree(store.root / "artifacts")
    (store.root / "artifacts").write_bytes(b"not a folder")
    with pytest.raises(OutageError):
        store.put_artifact("doc@1:parse", {"text": "x"})


def test_a_full_disk_fails_the_readiness_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = DirBlobStore(tmp_path / "store")
    store.check()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutageError):
        store.check()
    assert list((store.root / "tmp").iterdir()) == []

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

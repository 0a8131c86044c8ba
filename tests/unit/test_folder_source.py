"""The folder source's listing against a real directory: names that are not UTF-8, and directories
the walk cannot read (no services)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.sources.models import FolderSettings
from workers.sources.connector import Found
from workers.sources.folder import FolderConnector


def _connector(root: Path) -> FolderConnector:
    return FolderConnector(FolderSettings(path=str(root)), [root.parent], max_bytes=1 << 20)


def test_a_name_that_is_not_utf8_fails_its_item_with_a_storable_key(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    (root / "fine.txt").write_text("a fine name")
    with open(os.fsencode(root) + b"/bad\xffname.txt", "wb") as file:
        file.write(b"its name is Latin-1")
    found = {item.key: item for item in _connector(root).scan({}, "run") if isinstance(item, Found)}
    assert set(found) == {"fine.txt", "bad\ufffdname.txt"}
    bad = found["bad\ufffdname.txt"]
    # Stored as it was listed, the key and file name held lone surrogates: the item records could
    # not be written (the run retried for ever) and the KB's document list answered 500.
    assert bad.error is not None
    assert bad.error.code == ErrorCode.INVALID_ARGUMENT
    assert bad.key.encode("utf-8")
    assert bad.doc_id.encode("utf-8")
    assert found["fine.txt"].error is None


def test_a_directory_the_walk_cannot_read_fails_the_listing(tmp_path: Path) -> None:
    root = tmp_path / "share"
    root.mkdir()
    (root / "kept.txt").write_text("listed before the walk meets the unreadable directory")
    # A path longer than PATH_MAX cannot be opened by anyone (root too): the walk's scandir fails
    # there as it does on a directory without read permission or on an NFS error. Skipped in
    # silence, its files would read as deleted and their documents would go.
    fd = os.open(root, os.O_RDONLY)
    try:
        for _ in range(20):
            name = "d" * 250
            os.mkdir(name, dir_fd=fd)
            inner = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with open(os.open("deep.txt", os.O_CREAT | os.O_WRONLY, dir_fd=fd), "w") as file:
            file.write("out of reach")
    finally:
        os.close(fd)
    with pytest.raises(RaglineError) as error:
        list(_connector(root).scan({}, "run"))
    assert error.value.code == ErrorCode.UNAVAILABLE
    assert "nothing was deleted" in error.value.message


def test_a_directory_swapped_for_a_link_after_the_listing_leads_nowhere(tmp_path: Path) -> None:
    roots = tmp_path / "roots"
    root = roots / "share"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "shadow").write_text("listed inside the folder")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text("a secret outside every root")
    connector = FolderConnector(FolderSettings(path=str(root)), [roots], max_bytes=1 << 20)
    (item,) = [found for found in connector.scan({}, "run") if isinstance(found, Found)]
    assert connector.read(item) == b"listed inside the folder"
    # Whoever can write the folder swaps a directory the walk listed for a link out of the roots;
    # the path's last part is no link, so a check of it alone read the secret.
    (root / "sub").rename(root / "sub.listed")
    (root / "sub").symlink_to(outside)
    with pytest.raises(RaglineError) as error:
        connector.read(item)
    assert error.value.code == ErrorCode.NOT_FOUND

"""A front refuses to store bytes in a blob store that none of the live workers reads."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import redis

from shared import blob_sharing
from shared.blob_dir import DirBlobStore
from shared.blob_sharing import SharedBlobs
from shared.errors import ErrorCode, OutageError, RaglineError


class Stores:
    """The workers' announcements, as the hash holds them: the check's logic is under test here."""

    def __init__(self) -> None:
        self.hash: dict[str, str] = {}
        self.reads = 0
        self.down = False

    def hgetall(self, key: str) -> dict[str, str]:
        assert key == blob_sharing.STORES_KEY
        if self.down:
            raise redis.ConnectionError("down")
        self.reads += 1
        return dict(self.hash)

    def hset(self, key: str, field: str, value: str) -> None:
        self.hash[field] = value


def _check(blobs: DirBlobStore, stores: Stores) -> SharedBlobs:
    return SharedBlobs(blobs, stores, silent_s=60)  # type: ignore[arg-type]


def test_stores_on_one_directory_have_one_id_and_others_another(tmp_path: Path) -> None:
    one = DirBlobStore(tmp_path / "stack")
    assert one.identity() == DirBlobStore(tmp_path / "stack").identity() == one.identity()
    assert DirBlobStore(tmp_path / "elsewhere").identity() != one.identity()


def test_processes_creating_a_stores_id_at_once_agree_on_one(tmp_path: Path) -> None:
    ids: list[str] = []
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        ids.append(DirBlobStore(tmp_path / "fresh").identity())

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 16
    assert len(set(ids)) == 1


def test_a_front_on_the_workers_store_is_let_through(tmp_path: Path) -> None:
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", blobs.identity())  # type: ignore[arg-type]
    blob_sharing.announce(stores, "host:2", "another")  # type: ignore[arg-type]
    _check(blobs, stores).check()


def test_a_front_on_another_store_is_refused_by_a_stable_code(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stack, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", stack.identity())  # type: ignore[arg-type]
    elsewhere = DirBlobStore(tmp_path / "checkout" / ".ragline-state" / "blobstore")
    with pytest.raises(RaglineError) as refused:
        _check(elsewhere, stores).check()
    assert refused.value.code == ErrorCode.UNAVAILABLE
    assert "RAGLINE_STATE_DIR" in refused.value.message
    assert str(tmp_path) not in refused.value.message  # the server's paths are for its log
    assert str(elsewhere.root) in caplog.text


def test_no_live_announcement_is_nothing_to_compare(tmp_path: Path) -> None:
    stores = Stores()
    stores.hash["host:1"] = json.dumps({"store": "stack", "at": time.time() - 3600})  # a dead worker's
    stores.hash["host:2"] = "1733500000.0"  # not an announcement of this version
    _check(DirBlobStore(tmp_path / "elsewhere"), stores).check()


def test_the_answer_is_kept_a_while_then_asked_again(tmp_path: Path) -> None:
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", "another")  # type: ignore[arg-type]
    check = _check(blobs, stores)
    for _ in range(3):
        with pytest.raises(RaglineError):
            check.check()
    assert stores.reads == 1
    blob_sharing.announce(stores, "host:1", blobs.identity())  # type: ignore[arg-type]
    check._answer = (0.0, False)  # its time is up
    check.check()
    assert stores.reads == 2


def test_a_store_begun_anew_under_a_running_stack_is_still_the_workers(tmp_path: Path) -> None:
    """Its id file deleted: the front reads a new id at once, the workers announce the old one
    until they read it again, and uploads to the right store were refused meanwhile."""
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", blobs.identity())  # type: ignore[arg-type]
    check = _check(blobs, stores)
    check.check()
    (tmp_path / "stack" / "store-id").unlink()
    check._answer = (0.0, True)  # its time is up
    check.check()
    assert stores.reads == 2
    blob_sharing.announce(stores, "host:1", "another")  # type: ignore[arg-type]
    check._answer = (0.0, True)
    with pytest.raises(RaglineError):
        check.check()  # an id this front never read from its store is still another store


def test_an_old_id_of_its_store_is_its_own_only_within_the_worker_silence_window(tmp_path: Path) -> None:
    """A store whose id file was copied from the workers' store, then deleted: past the window in
    which workers still announce a store's former id, that id names the workers' store, not this."""
    workers, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", workers.identity())  # type: ignore[arg-type]
    copy = DirBlobStore(tmp_path / "copy")
    (tmp_path / "copy" / "store-id").write_text(workers.identity())
    check = _check(copy, stores)
    check.check()  # a copied id file cannot be told apart
    (tmp_path / "copy" / "store-id").unlink()
    check._answer = (0.0, True)
    check.check()  # within the window: as a store begun anew
    check._own_ids = {i: seen - 61 for i, seen in check._own_ids.items()}  # the window has passed
    check._answer = (0.0, True)
    with pytest.raises(RaglineError):
        check.check()


def test_redis_down_is_left_to_the_request_and_asked_again_soon(tmp_path: Path) -> None:
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", "another")  # type: ignore[arg-type]
    check = _check(blobs, stores)
    stores.down = True
    check.check()
    stores.down = False
    check.check()  # within UNKNOWN_FRESH_S: not asked again at each upload
    assert stores.reads == 0
    check._answer = (0.0, None)  # its time is up
    with pytest.raises(RaglineError):
        check.check()


class _Slow(Stores):
    """The workers' hash behind a Redis that answers once `release` is set."""

    def __init__(self, hash_: dict[str, str]) -> None:
        super().__init__()
        self.hash = hash_
        self.release = threading.Event()
        self.asked = 0

    def hgetall(self, key: str) -> dict[str, str]:
        self.asked += 1
        self.release.wait(10)
        return super().hgetall(key)


def _uploads(check: SharedBlobs, count: int) -> tuple[list[threading.Thread], list[str]]:
    """`count` uploads checking at once; what each was answered, as they are answered."""
    answered: list[str] = []

    def upload() -> None:
        try:
            check.check()
            answered.append("accepted")
        except RaglineError:
            answered.append("refused")

    threads = [threading.Thread(target=upload) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, answered


def test_a_burst_on_a_fresh_front_waits_for_the_first_answer(tmp_path: Path) -> None:
    """The uploads that came while the first check was asking went through unchecked: 16 of 32 on
    a fresh API on another state dir were accepted, then failed."""
    stores = Stores()
    blob_sharing.announce(stores, "host:1", "the-workers-store")  # type: ignore[arg-type]
    slow = _Slow(stores.hash)
    threads, answered = _uploads(_check(DirBlobStore(tmp_path / "elsewhere"), slow), 8)
    time.sleep(0.3)
    assert answered == []  # all wait for the one question in flight
    slow.release.set()
    for thread in threads:
        thread.join()
    assert (slow.asked, answered) == (1, ["refused"] * 8)


def test_a_slow_answer_later_holds_one_upload_not_every_upload_in_turn(tmp_path: Path) -> None:
    """The check held its lock while it asked: eight uploads behind a slow Redis were answered one
    after another, the last after eight of its timeouts."""
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    blob_sharing.announce(stores, "host:1", blobs.identity())  # type: ignore[arg-type]
    slow = _Slow(stores.hash)
    slow.release.set()
    check = _check(blobs, slow)
    check.check()  # a first answer: shared
    slow.release.clear()
    check._answer = (0.0, True)  # its time is up
    threads, answered = _uploads(check, 8)
    for _ in range(500):
        if len(answered) == 7:
            break
        time.sleep(0.01)
    assert slow.asked == 2
    assert answered == ["accepted"] * 7  # the others went by the last answer meanwhile
    slow.release.set()
    for thread in threads:
        thread.join()
    assert len(answered) == 8


def test_a_stores_id_file_replaced_by_anything_is_read_as_a_short_string(tmp_path: Path) -> None:
    store = DirBlobStore(tmp_path / "stack")
    (tmp_path / "stack" / "store-id").write_bytes(b"\xff\xfe" + b"x" * 10_000_000)
    found = store.identity()
    assert len(found) <= 64
    assert found == DirBlobStore(tmp_path / "stack").identity()


def test_a_store_whose_directory_was_deleted_under_it_is_laid_out_again(tmp_path: Path) -> None:
    """`rm -rf` of the blob store under a running stack: every upload failed until a restart,
    with a message that named the server's paths."""
    store = DirBlobStore(tmp_path / "stack")
    before = store.identity()
    shutil.rmtree(tmp_path / "stack")
    assert store.identity() != before  # a store begun anew
    shutil.rmtree(tmp_path / "stack")
    blob = store.put(b"A note.")
    with store.pinned(blob.sha256):
        assert store.read(blob.sha256) == b"A note."
    shutil.rmtree(tmp_path / "stack")
    store.put_artifact("doc@1:parse", {"text": "A note."})
    assert store.get_artifact("doc@1:parse") == {"text": "A note."}


def test_an_id_that_cannot_be_read_is_an_outage_whose_message_names_no_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = DirBlobStore(tmp_path / "stack")
    (tmp_path / "stack" / "store-id").mkdir()
    with pytest.raises(OutageError) as failed:
        store.identity()
    assert str(tmp_path) not in failed.value.message
    assert str(tmp_path) in caplog.text


def test_what_is_no_announcement_is_passed_over(tmp_path: Path) -> None:
    """Deeply nested JSON (a RecursionError: every upload of every front a 500), an entry from far
    ahead (it never aged out), an id of megabytes (logged whole every few seconds)."""
    stores = Stores()
    stores.hash["nested"] = "[" * 200_000 + "]" * 200_000
    stores.hash["ahead"] = json.dumps({"store": "another", "at": time.time() + 1e9})
    stores.hash["huge"] = json.dumps({"store": "y" * 20_000_000, "at": time.time()})
    assert blob_sharing.live_stores(stores, silent_s=60) == set()  # type: ignore[arg-type]
    _check(DirBlobStore(tmp_path / "elsewhere"), stores).check()


def test_redis_down_is_one_line_in_the_log_for_the_whole_outage(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stdio MCP's stderr got a 45-line traceback at each ask, beside the one line it had said."""
    blobs, stores = DirBlobStore(tmp_path / "stack"), Stores()
    check = _check(blobs, stores)
    stores.down = True
    for _ in range(3):
        check._answer = (0.0, None)  # its time is up
        check.check()
    records = [r for r in caplog.records if r.name == "shared.blob_sharing"]
    assert len(records) == 1
    assert not records[0].exc_info
    assert "down" in records[0].getMessage()
    stores.down = False
    check._answer = (0.0, None)
    check.check()  # the outage is over: a later one is said again
    stores.down = True
    check._answer = (0.0, True)
    check.check()
    assert len([r for r in caplog.records if r.name == "shared.blob_sharing"]) == 2

"""The S3 blob store against the real S3-compatible server of the local stack (deploy/local/s3.sh):
blobs and artifacts whole or not at all, pins and removals excluding each other across processes
through their Redis locks, and a stopped server reported as an outage, as Redis's or OpenSearch's.

Each test works under a prefix of its own in the bucket. The store is the one RAGLINE_BLOBS__*
configures when it names a bucket (the suite's S3 pass), else the local server's, whose
settings deploy/local/s3.sh keeps in <state dir>/s3/blobs.env.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

import pytest
import redis

from shared import s3
from shared.blob_s3 import PART_BYTES, S3BlobStore, endpoint_of
from shared.blobs import BlobTooLarge
from shared.config import REPO_ROOT, BlobsSettings, Settings
from shared.errors import OutageError, TransientError
from shared.ingest import StageRef
from shared.models import Stage
from shared.stripe_locks import StripeLocks
from tests.integration.stack_control import stack
from workers.failures import classify, is_outage

pytestmark = pytest.mark.integration

START_HINT = "start it with `bash deploy/local/stack.sh up s3` (or run `make test`, which starts it)"


def _env_file(path: Path) -> dict[str, str]:
    if not path.is_file():
        pytest.fail(f"no S3 settings at {path}: the local S3 server has never started; {START_HINT}")
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


@pytest.fixture(scope="module")
def server(settings: Settings) -> BlobsSettings:
    """The S3 server's settings, its bucket checked."""
    if settings.blobs.url is not None:
        found = settings.blobs
    else:
        env = _env_file(settings.state_dir / "s3" / "blobs.env")
        found = BlobsSettings(
            url=env["RAGLINE_BLOBS__URL"],
            endpoint_url=env["RAGLINE_BLOBS__ENDPOINT_URL"],
            region=env["RAGLINE_BLOBS__REGION"],
            access_key_id=env["RAGLINE_BLOBS__ACCESS_KEY_ID"],
            secret_access_key=env["RAGLINE_BLOBS__SECRET_ACCESS_KEY"],
        )
    try:
        s3.check_bucket(s3.make_client(endpoint_of(found)), found.bucket, "the test")
    except OutageError as error:
        pytest.fail(f"the S3 server at {found.endpoint_url} does not serve ({error}); {START_HINT}")
    return found


@pytest.fixture
def place(server: BlobsSettings) -> BlobsSettings:
    """The server's bucket, under a prefix no other test uses."""
    return server.model_copy(update={"url": f"s3://{server.bucket}/test-{uuid.uuid4().hex[:12]}"})


@pytest.fixture
def store(place: BlobsSettings, redis_client: redis.Redis, tmp_path: Path) -> S3BlobStore:
    return S3BlobStore(place, redis_client, tmp_path / "scratch")


def _keys(place: BlobsSettings) -> list[str]:
    client = s3.make_client(endpoint_of(place))
    return [item.key for item in s3.list_objects(client, place.bucket, place.prefix, "the test")]


def _uploads(place: BlobsSettings) -> list[str]:
    client = s3.make_client(endpoint_of(place))
    listed = client.list_multipart_uploads(Bucket=place.bucket, Prefix=place.prefix)
    return [upload["Key"] for upload in listed.get("Uploads", [])]


def test_a_blob_is_stored_by_its_digest_and_read_back(store: S3BlobStore, place: BlobsSettings) -> None:
    data = f"The lighthouse keeper logs every ship, {uuid.uuid4()}.\n".encode()
    sha = hashlib.sha256(data).hexdigest()
    stored = store.put([data[:10], data[10:]])
    assert (stored.sha256, stored.size) == (sha, len(data))
    assert store.exists(sha)
    assert store.read(sha) == data
    with store.local_file(sha) as path:
        assert path.read_bytes() == data
        assert path.is_relative_to(store._scratch)
    assert not path.exists()  # the local copy lasts the context only
    assert store.put(data) == stored  # the same bytes again: one blob
    assert _keys(place) == [f"{place.prefix}blobs/{sha[:2]}/{sha[2:4]}/{sha}"]

    absent = hashlib.sha256(b"never stored").hexdigest()
    assert not store.exists(absent)
    with pytest.raises(FileNotFoundError):
        store.read(absent)
    with pytest.raises(FileNotFoundError), store.local_file(absent):
        pass
    with pytest.raises(ValueError, match="sha256"):
        store.exists("../../etc/passwd")


def test_a_blob_larger_than_a_part_goes_up_in_parts(store: S3BlobStore, place: BlobsSettings) -> None:
    chunk = os.urandom(1 << 20)
    chunks = [chunk] * (PART_BYTES // len(chunk) + 3)
    whole = b"".join(chunks)
    stored = store.put(iter(chunks))
    assert stored.sha256 == hashlib.sha256(whole).hexdigest()
    assert store.read(stored.sha256) == whole
    assert len(_keys(place)) == 1
    assert _uploads(place) == []


def _failing_stream(parts: int) -> Iterator[bytes]:
    for _ in range(parts):
        yield b"a line of a document that the client never finishes sending\n" * 1000
    raise ConnectionResetError("the client went away")


class _BreaksAfter:
    """A body that reads `limit` bytes, then fails: a disk or a spool that breaks mid-upload."""

    def __init__(self, data: bytes, limit: int) -> None:
        self._data, self._at, self._limit = data, 0, limit

    def read(self, size: int = -1) -> bytes:
        if self._at >= self._limit:
            raise OSError("the spooled copy could not be read")
        part = self._data[self._at : self._at + size]
        self._at += len(part)
        return part


def test_a_put_that_fails_leaves_no_object(store: S3BlobStore, place: BlobsSettings) -> None:
    with pytest.raises(ConnectionResetError):
        store.put(_failing_stream(3))
    with pytest.raises(BlobTooLarge):
        store.put([b"x" * 600, b"y" * 600], max_bytes=1000)
    assert _keys(place) == []

    # A multipart upload that breaks after its first part is aborted: no object, no parts kept.
    data = os.urandom(PART_BYTES * 2)
    key = store.blob_key(hashlib.sha256(data).hexdigest())
    body: IO[bytes] = _BreaksAfter(data, PART_BYTES)  # type: ignore[assignment]
    with pytest.raises(OSError, match="spooled copy"):
        store._upload(key, body, len(data))
    assert _keys(place) == []
    assert _uploads(place) == []


def test_artifacts_round_trip_and_are_dropped(store: S3BlobStore, place: BlobsSettings) -> None:
    key = "t-1/kb/notes/tide-table.txt/v1/parse"
    value = {"elements": [{"text": "Hochwasser um 6 Uhr", "type": "Title"}], "title_hint": "Gezeiten"}
    assert not store.has_artifact(key)
    store.put_artifact(key, value)
    assert store.has_artifact(key)
    assert store.get_artifact(key) == value
    assert all(key not in name for name in _keys(place))  # named by the key's digest only
    store.drop_artifacts([key, "t-1/kb/never/v1/chunk"])
    assert not store.has_artifact(key)
    with pytest.raises(FileNotFoundError):
        store.get_artifact(key)
    assert _keys(place) == []


def test_remove_unused_removes_only_what_no_record_needs(store: S3BlobStore) -> None:
    kept, dropped = store.put(b"needed by a live record"), store.put(b"needed by none")
    asked: list[list[str]] = []

    def needed(blobs: list[str]) -> set[str]:
        asked.append(blobs)
        return {kept.sha256}

    assert store.remove_unused([kept.sha256, dropped.sha256, dropped.sha256], needed) == {dropped.sha256}
    assert asked == [sorted({kept.sha256, dropped.sha256})]
    assert store.exists(kept.sha256)
    assert not store.exists(dropped.sha256)
    with store.pinned(kept.sha256), store.pinned(kept.sha256):  # pins of one blob go together
        assert store.exists(kept.sha256)


class _Holder:
    """tests/integration/blob_holder.py in a process of its own, holding a lock of `place`."""

    def __init__(self, place: BlobsSettings, action: str, sha256: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_BLOBS__")}
        env.update(_blob_env(place))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.blob_holder", action, sha256],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().strip()
        assert line == "held", f"the holder did not take the lock (said {line!r})"

    def release(self) -> None:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().strip() == "released"
        assert self.process.wait(timeout=60) == 0

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)


def _blob_env(place: BlobsSettings) -> dict[str, str]:
    secret = place.secret_access_key
    values = {
        "RAGLINE_BLOBS__URL": place.url,
        "RAGLINE_BLOBS__ENDPOINT_URL": place.endpoint_url,
        "RAGLINE_BLOBS__REGION": place.region,
        "RAGLINE_BLOBS__ACCESS_KEY_ID": place.access_key_id,
        "RAGLINE_BLOBS__SECRET_ACCESS_KEY": secret.get_secret_value() if secret is not None else None,
    }
    return {name: value for name, value in values.items() if value is not None}


def _quick(store: S3BlobStore, broker: redis.Redis, wait_s: float = 0.5) -> StripeLocks:
    """The store's locks, seen by this process with a short wait."""
    return StripeLocks(broker, store.lock_namespace, wait_s=wait_s)


def test_a_pin_in_another_process_holds_off_a_removal(
    store: S3BlobStore, place: BlobsSettings, redis_client: redis.Redis
) -> None:
    blob = store.put(b"bytes a submit on another host is about to register")
    stripe = blob.sha256[:2]
    holder = _Holder(place, "pin", blob.sha256)
    try:
        with pytest.raises(TransientError, match="busy"), _quick(store, redis_client).exclusive(stripe):
            pass
        with _quick(store, redis_client).shared(stripe):  # another pin goes along
            pass
    finally:
        holder.release()
    assert store.remove_unused([blob.sha256], lambda blobs: set()) == {blob.sha256}
    assert not store.exists(blob.sha256)


def test_a_removal_in_another_process_holds_off_a_pin(
    store: S3BlobStore, place: BlobsSettings, redis_client: redis.Redis
) -> None:
    blob = store.put(b"bytes a delete on another host is deciding about")
    stripe = blob.sha256[:2]
    holder = _Holder(place, "remove", blob.sha256)
    try:
        for take in (_quick(store, redis_client).shared, _quick(store, redis_client).exclusive):
            with pytest.raises(TransientError, match="busy"), take(stripe):
                pass
    finally:
        holder.release()
    with store.pinned(blob.sha256):
        assert store.exists(blob.sha256)  # the removal kept it: its record still needed it


def test_a_dead_holders_lock_expires_and_a_live_holders_does_not(
    store: S3BlobStore, place: BlobsSettings, redis_client: redis.Redis
) -> None:
    sha = hashlib.sha256(uuid.uuid4().bytes).hexdigest()
    stripe = sha[:2]
    live = _Holder(place, "expiring", sha)
    try:
        time.sleep(3)  # three expiries: only renewals keep it
        with pytest.raises(TransientError, match="busy"), _quick(store, redis_client).shared(stripe):
            pass
    finally:
        live.release()

    dead = _Holder(place, "expiring", sha)
    dead.kill()  # SIGKILL: it never releases; its hold runs out
    with _quick(store, redis_client, wait_s=30).shared(stripe):
        pass


def test_a_missing_bucket_is_named(place: BlobsSettings, redis_client: redis.Redis, tmp_path: Path) -> None:
    missing = place.model_copy(update={"url": f"s3://ragline-missing-{uuid.uuid4().hex[:8]}/blobs"})
    store = S3BlobStore(missing, redis_client, tmp_path)
    for call in (lambda: store.put(b"data"), lambda: store.exists("0" * 64)):
        with pytest.raises(OutageError, match=f"bucket '{missing.bucket}' does not exist"):
            call()


def test_the_server_stopped_is_an_outage_the_documents_wait_out(store: S3BlobStore) -> None:
    blob = store.put(b"stored before the server stopped")
    ref = StageRef("t", "kb", "doc", 1, Stage.PARSE)
    stack("down", "s3")
    try:
        calls: dict[str, Callable[[], object]] = {
            "put": lambda: store.put(b"sent while the server is down"),
            "exists": lambda: store.exists(blob.sha256),
            "read": lambda: store.read(blob.sha256),
            "artifact": lambda: store.put_artifact("t/kb/doc/v1/parse", {}),
            "remove": lambda: store.remove_unused([blob.sha256], lambda blobs: set()),
        }
        for name, call in calls.items():
            with pytest.raises(OutageError, match="unreachable") as raised:
                call()
            failure = classify(ref, raised.value)
            assert is_outage(failure), name
            assert failure.retryable, name
    finally:
        stack("up", "s3")
    assert store.read(blob.sha256) == b"stored before the server stopped"


def test_stores_on_one_prefix_agree_on_one_id_and_another_prefix_has_its_own(
    place: BlobsSettings, server: BlobsSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    """Many processes asking a fresh prefix for its id at once (an API and its workers starting
    together) agree on the id that stands; the S3 server is asked what it honours, not assumed to."""
    stores = [S3BlobStore(place, redis_client, tmp_path / f"scratch{i}") for i in range(8)]
    with ThreadPoolExecutor(len(stores)) as pool:
        first = list(pool.map(lambda store: store.identity(), stores))
    again = {store.identity() for store in stores}
    assert len(again) == 1
    assert set(first) == again  # no process was told an id that did not stand
    assert _keys(place) == [f"{place.prefix}store-id"]
    other = server.model_copy(update={"url": f"s3://{server.bucket}/test-{uuid.uuid4().hex[:12]}"})
    assert S3BlobStore(other, redis_client, tmp_path / "other").identity() not in again

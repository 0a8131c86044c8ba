"""The `s3` source through the real API and a worker of its own, against the local S3-compatible
server (S3Proxy, deploy/local/s3.sh): first sync, a change, a deletion, an unchanged re-sync that
reads no object, a run resumed after its worker was killed, and who may read which bucket."""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from shared.config import Settings
from shared.s3 import S3Endpoint, make_client
from tests.e2e.conftest import local_s3
from tests.e2e.own_stack import OwnStack
from tests.e2e.sources import ENDED, add, counts, documents, sync, wait_run

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def store(settings: Settings) -> dict[str, str]:
    return local_s3(settings)


@pytest.fixture(scope="module")
def s3(store: dict[str, str]) -> S3Client:
    return make_client(
        S3Endpoint(
            store["RAGLINE_BLOBS__ENDPOINT_URL"],
            store["RAGLINE_BLOBS__REGION"],
            store["RAGLINE_BLOBS__ACCESS_KEY_ID"],
            store["RAGLINE_BLOBS__SECRET_ACCESS_KEY"],
            30.0,
        )
    )


@pytest.fixture
def stack(sources_stack: OwnStack) -> OwnStack:
    return sources_stack


@pytest.fixture
def kb(stack: OwnStack) -> Iterator[str]:
    kb_id = f"s3-{secrets.token_hex(4)}"
    with stack.server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
        yield kb_id
        client.delete(f"/v1/kbs/{kb_id}")


def _tenant(stack: OwnStack) -> str:
    return str(
        next(e["tenant"] for e in json.loads(stack.server.keys_file.read_text()) if e["name"] == "a_admin")
    )


@pytest.fixture
def bucket(s3: S3Client, stack: OwnStack) -> Iterator[str]:
    name = f"src-{_tenant(stack)}-{secrets.token_hex(3)}"
    s3.create_bucket(Bucket=name)
    yield name
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=name):
        for item in page.get("Contents", []):
            s3.delete_object(Bucket=name, Key=item["Key"])
    s3.delete_bucket(Bucket=name)


def _put(s3: S3Client, bucket: str, key: str, text: str) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=text.encode())


def test_a_bucket_prefix_is_followed_object_by_object(
    stack: OwnStack, s3: S3Client, bucket: str, kb: str
) -> None:
    _put(s3, bucket, "manual/intro.md", "# Intro\n\nThe narwhal's tusk is a tooth.")
    _put(s3, bucket, "manual/deep/dive.md", "# Dive\n\nSperm whales dive two kilometres deep.")
    _put(s3, bucket, "manual/notes.txt", "Orcas hunt in family pods.")
    _put(s3, bucket, "other/elsewhere.txt", "Outside the prefix.")
    with stack.server.client("a_admin") as client:
        add(
            client,
            kb,
            {"type": "s3", "source_id": "whales", "settings": {"bucket": bucket, "prefix": "manual/"}},
        )
        first = sync(client, kb, "whales")
        assert first["status"] == "succeeded", first
        assert counts(first) == {"created": 3}
        docs = documents(client, kb)
        assert set(docs) == {"intro.md", "deep/dive.md", "notes.txt"}
        assert docs["deep/dive.md"]["source_uri"] == f"s3://{bucket}/manual/deep/dive.md"
        hit = client.post("/v1/search", json={"query": "narwhal tusk", "kb_ids": [kb], "top_k": 1}).json()
        assert hit["results"][0]["source_uri"] == f"s3://{bucket}/manual/intro.md"

        _put(s3, bucket, "manual/intro.md", "# Intro\n\nThe narwhal's tusk has ten million nerve endings.")
        s3.delete_object(Bucket=bucket, Key="manual/notes.txt")
        second = sync(client, kb, "whales")
        assert counts(second) == {"updated": 1, "deleted": 1, "unchanged": 1}, second
        assert set(documents(client, kb)) == {"intro.md", "deep/dive.md"}

        third = sync(client, kb, "whales")
        assert counts(third) == {"unchanged": 2}, third
        assert client.get(f"/v1/batches/{third['run_id']}").json()["total"] == 0  # nothing submitted


def test_a_killed_worker_s_run_is_resumed(stack: OwnStack, s3: S3Client, bucket: str, kb: str) -> None:
    total = 400
    for n in range(total):
        _put(s3, bucket, f"log/{n:04d}.txt", f"Ship's log {n}: a humpback breached at dawn, bearing {n}.")
    with stack.server.client("a_admin") as client:
        add(client, kb, {"type": "s3", "source_id": "log", "settings": {"bucket": bucket, "prefix": "log/"}})
        started = client.post(f"/v1/kbs/{kb}/sources/log/sync").json()
        deadline = time.monotonic() + 300
        while True:
            run = client.get(f"/v1/kbs/{kb}/sources/log/runs/{started['run_id']}").json()
            assert run["status"] not in ENDED, f"ended before the kill: {run}"
            if run["listed"] >= 100:
                break
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
        stack.kill_worker()
        stack.start_worker()
        run = wait_run(client, kb, "log", started["run_id"])
        assert run["status"] == "succeeded", run
        assert run["attempts"] >= 2
        assert counts(run) == {"created": total}, run
        docs = documents(client, kb)
        assert len(docs) == total
        assert {d["content_version"] for d in docs.values()} == {1}


def test_who_may_read_which_bucket(
    stack: OwnStack, s3: S3Client, bucket: str, kb: str, store: dict[str, str]
) -> None:
    stranger = f"src-someone-else-{secrets.token_hex(3)}"
    s3.create_bucket(Bucket=stranger)
    _put(s3, stranger, "secret.txt", "not yours")
    try:
        with stack.server.client("a_admin") as client:
            # The deployment's keys serve only this tenant's buckets.
            add(client, kb, {"type": "s3", "source_id": "theirs", "settings": {"bucket": stranger}})
            refused = sync(client, kb, "theirs")
            assert (refused["status"], refused["error"]["code"]) == ("failed", "FORBIDDEN"), refused
            # With keys of its own, a source reads any bucket those keys open.
            own: dict[str, Any] = {
                "bucket": stranger,
                "endpoint_url": store["RAGLINE_BLOBS__ENDPOINT_URL"],
                "access_key_id": store["RAGLINE_BLOBS__ACCESS_KEY_ID"],
                "secret_access_key": store["RAGLINE_BLOBS__SECRET_ACCESS_KEY"],
            }
            view = add(client, kb, {"type": "s3", "source_id": "keyed", "settings": own})
            assert view["settings"]["secret_access_key"] == "********"
            listed = client.get(f"/v1/kbs/{kb}/sources/keyed").text
            assert store["RAGLINE_BLOBS__SECRET_ACCESS_KEY"] not in listed
            assert counts(sync(client, kb, "keyed")) == {"created": 1}
            # Wrong keys, a missing bucket: the run fails and deletes nothing.
            wrong = {**own, "secret_access_key": "not-the-secret-0123456789"}
            add(client, kb, {"type": "s3", "source_id": "wrong", "settings": wrong})
            assert sync(client, kb, "wrong")["error"]["code"] == "FORBIDDEN"
            add(
                client,
                kb,
                {"type": "s3", "source_id": "missing", "settings": {**own, "bucket": f"{bucket}-none"}},
            )
            assert sync(client, kb, "missing")["error"]["code"] == "NOT_FOUND"
            assert set(documents(client, kb)) == {"secret.txt"}
            # An endpoint the fetch policy refuses (a private address) is refused at once.
            metadata = {**own, "endpoint_url": "http://169.254.169.254/"}
            blocked = client.post(f"/v1/kbs/{kb}/sources", json={"type": "s3", "settings": metadata})
            assert (blocked.status_code, blocked.json()["code"]) == (422, "FETCH_REFUSED"), blocked.text
    finally:
        s3.delete_object(Bucket=stranger, Key="secret.txt")
        s3.delete_bucket(Bucket=stranger)

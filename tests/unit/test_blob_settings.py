"""The blob store's settings and the one choice of store they make, and how the S3 client's failures
become Ragline's (an outage documents wait out, or a missing object): pure logic, no service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from shared import s3
from shared.blob_dir import DirBlobStore
from shared.blob_s3 import S3BlobStore
from shared.config import ConfigError, load_settings
from shared.errors import OutageError
from shared.wiring import blob_store

# Nothing listens there: building a store must not connect.
NOWHERE = redis.Redis.from_url("redis://127.0.0.1:9/0")


def test_the_state_dirs_directory_is_the_default(tmp_path: Path) -> None:
    store = blob_store(load_settings(state_dir=tmp_path), NOWHERE)
    assert isinstance(store, DirBlobStore)
    assert store.root == tmp_path / "blobstore"


def test_an_s3_url_chooses_the_bucket_store_without_connecting(tmp_path: Path) -> None:
    settings = load_settings(
        state_dir=tmp_path,
        blobs={
            "url": "s3://team-blobs/ragline/prod/",
            "endpoint_url": "http://127.0.0.1:9/",
            "access_key_id": "id",
            "secret_access_key": "secret",
        },
    )
    store = blob_store(settings, NOWHERE)
    assert isinstance(store, S3BlobStore)
    assert (store.bucket, store.prefix) == ("team-blobs", "ragline/prod/")
    assert store.blob_key("ab" * 32) == f"ragline/prod/blobs/ab/ab/{'ab' * 32}"
    assert settings.blobs.endpoint_url == "http://127.0.0.1:9"
    assert load_settings(blobs={"url": "s3://team-blobs"}).blobs.prefix == ""


@pytest.mark.parametrize(
    ("blobs", "variable"),
    [
        ({"url": "/srv/blobs"}, "RAGLINE_BLOBS__URL"),
        ({"url": "s3://Upper_Case"}, "RAGLINE_BLOBS__URL"),
        ({"url": "s3://b"}, "RAGLINE_BLOBS__URL"),
        ({"endpoint_url": "127.0.0.1:9100"}, "RAGLINE_BLOBS__ENDPOINT_URL"),
        ({"region": "EU Central"}, "RAGLINE_BLOBS__REGION"),
        ({"timeout_s": 0}, "RAGLINE_BLOBS__TIMEOUT_S"),
        ({"access_key_id": "only-the-key"}, "RAGLINE_BLOBS"),
    ],
)
def test_bad_blob_settings_are_refused_by_name(blobs: dict[str, object], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        load_settings(blobs=blobs)


def test_a_secret_without_its_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings(blobs={"secret_access_key": "wJalrXUtnFEMI-not-shown"})
    assert "wJalrXUtnFEMI" not in str(refused.value)


def _client_error(code: str, status: int) -> ClientError:
    answer: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(answer, "GetObject")


@pytest.mark.parametrize(
    ("error", "expected", "words"),
    [
        (_client_error("NoSuchBucket", 404), OutageError, "bucket 'blobs' does not exist"),
        (_client_error("AccessDenied", 403), OutageError, "refused access to bucket 'blobs'"),
        (_client_error("SignatureDoesNotMatch", 403), OutageError, "refused access"),
        (_client_error("SlowDown", 503), OutageError, "unavailable or overloaded"),
        (_client_error("InternalError", 500), OutageError, "unavailable or overloaded"),
        (_client_error("NoSuchKey", 404), FileNotFoundError, "no such object"),
        (_client_error("404", 404), FileNotFoundError, "no such object"),
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:9"), OutageError, "unreachable"),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:9"), OutageError, "unreachable"),
    ],
)
def test_store_failures_become_ragline_failures(
    error: Exception, expected: type[Exception], words: str
) -> None:
    with pytest.raises(expected, match=words), s3.translated("blobs", "RAGLINE_BLOBS__URL"):
        raise error


def test_a_request_the_store_finds_bad_stays_the_clients_error() -> None:
    with pytest.raises(ClientError), s3.translated("blobs", "RAGLINE_BLOBS__URL"):
        raise _client_error("InvalidArgument", 400)

"""S3-compatible object stores: the one client factory, the one translation of their failures, and
listing and reading a bucket's objects, for the S3 blob store and any other part that reads a bucket.

Failures are translated where they happen, so the rest of Ragline sees its own vocabulary: a store
that cannot be reached, answers 5xx or throttles is an `OutageError` (documents wait, the API
answers UNAVAILABLE), as an OpenSearch or Redis outage is; so are a missing bucket and refused
credentials, which an operator fixes without any document being at fault; a missing object is a
`FileNotFoundError`, as for a file of the local blob store.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from shared.errors import OutageError

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Codes of a store that works but will not serve now: waited out like an outage.
_BUSY = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}
_MISSING_OBJECT = {"NoSuchKey", "404", "NotFound"}


class BucketMissing(OutageError):
    """The bucket does not exist."""


class AccessRefused(OutageError):
    """The store refused the credentials or the request."""


@dataclass(frozen=True)
class S3Endpoint:
    """How to reach a store: its endpoint (None: AWS), region and credentials (None: boto3's chain)."""

    endpoint_url: str | None
    region: str
    access_key_id: str | None
    secret_access_key: str | None
    timeout_s: float


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    etag: str  # as the store gives it, quotes removed
    last_modified: datetime | None


def make_client(endpoint: S3Endpoint, *, attempts: int = 3) -> S3Client:
    """A client with bounded waits and few retries: a store that is down is reported, not waited on."""
    config = Config(
        connect_timeout=min(endpoint.timeout_s, 10.0),
        read_timeout=endpoint.timeout_s,
        retries={"max_attempts": attempts, "mode": "standard"},
        # Path-style addressing and checksums only where S3 requires them: what S3-compatible
        # servers (S3Proxy, SeaweedFS, Ceph) understand alike.
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        max_pool_connections=20,
    )
    session = boto3.session.Session()
    client: S3Client = session.client(
        "s3",
        endpoint_url=endpoint.endpoint_url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
        config=config,
    )
    return client


def error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


def http_status(error: ClientError) -> int:
    return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def is_missing_object(error: ClientError) -> bool:
    return error_code(error) in _MISSING_OBJECT or (
        http_status(error) == 404 and error_code(error) != "NoSuchBucket"
    )


@contextlib.contextmanager
def translated(bucket: str, where: str) -> Iterator[None]:
    """Turn the client's failures into Ragline's (see the module docstring); `where` names the
    setting or source that points at the store, for the operator's message."""
    try:
        yield
    except ClientError as error:
        code, status = error_code(error), http_status(error)
        if code == "NoSuchBucket":
            raise BucketMissing(f"the bucket '{bucket}' does not exist ({where}); create it") from error
        if code in _DENIED or status == 403:
            raise AccessRefused(f"the store refused access to bucket '{bucket}' ({where}): {code}") from error
        if code in _BUSY or status >= 500:
            raise OutageError(f"the S3 store is unavailable or overloaded ({code or status})") from error
        if is_missing_object(error):
            raise FileNotFoundError(f"no such object in bucket '{bucket}'") from error
        raise
    except BotoCoreError as error:  # no connection, a timeout, a dropped connection
        raise OutageError(f"the S3 store is unreachable ({type(error).__name__})") from error


def check_bucket(s3: S3Client, bucket: str, where: str) -> None:
    """Raise OutageError naming the bucket when it does not exist (a HEAD of an object in a missing
    bucket says only 404, like a missing object)."""
    try:
        with translated(bucket, where):
            s3.head_bucket(Bucket=bucket)
    except FileNotFoundError:
        raise BucketMissing(f"the bucket '{bucket}' does not exist ({where}); create it") from None


def info_of(key: str, item: Any) -> ObjectInfo:
    """An ObjectInfo from a listing entry or a HEAD answer."""
    size = item.get("Size", item.get("ContentLength", 0))
    return ObjectInfo(key, int(size), str(item.get("ETag", "")).strip('"'), item.get("LastModified"))


def list_objects(s3: S3Client, bucket: str, prefix: str, where: str) -> Iterator[ObjectInfo]:
    """Every object under `prefix`, in key order, page by page."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    with translated(bucket, where):
        for page in pages:
            for item in page.get("Contents", []):
                yield info_of(item["Key"], item)


def head_object(s3: S3Client, bucket: str, key: str, where: str) -> ObjectInfo | None:
    """The object's size and ETag, or None when there is none."""
    try:
        with translated(bucket, where):
            answer = s3.head_object(Bucket=bucket, Key=key)
    except FileNotFoundError:
        return None
    return info_of(key, answer)


def read_object(s3: S3Client, bucket: str, key: str, where: str, limit: int | None = None) -> bytes:
    """The object's bytes, or at most `limit` + 1 of them (the caller refuses an object over its
    limit: a store need not send what its listing said); FileNotFoundError when there is none."""
    with translated(bucket, where):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            return body.read() if limit is None else body.read(limit + 1)
        finally:
            body.close()

"""The `s3` source: the objects under a prefix of a bucket on any S3-compatible store.

An object's version is its ETag, which the listing gives: an unchanged bucket is one listing and
no object read. The store a source names is reached only when the fetch policy allows its
address (checked here after resolving it, as the fetcher checks a URL); the deployment's own
store (`RAGLINE_SOURCES__S3_ENDPOINT_URL`) is the operator's and is not checked. The deployment's
credentials serve only the buckets `RAGLINE_SOURCES__S3_BUCKETS` names for the source's tenant,
on the deployment's store: a tenant must not read another's bucket with keys it was never given,
nor have them sign requests to a server of its choosing.

A store that cannot be reached, or refuses, fails the run (UNAVAILABLE, FORBIDDEN, NOT_FOUND):
it is the source's store, not Ragline's, and the next run tries again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING

from shared.config import Settings
from shared.errors import ErrorCode, OutageError, PermanentError, RaglineError
from shared.fetch.client import resolve
from shared.fetch.policy import FetchPolicy, check_url
from shared.models import safe_doc_id
from shared.s3 import AccessRefused, BucketMissing, S3Endpoint, list_objects, make_client, read_object
from shared.sources.models import ItemState, S3Settings
from workers.sources.connector import Connector, Found, Gone, selected

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def endpoint_for(settings: S3Settings, deployment: Settings, tenant_id: str) -> S3Endpoint:
    """How this source reaches its store, refused where it may not."""
    sources = deployment.sources
    own_keys = settings.access_key_id is not None
    if not own_keys:
        allowed = [pattern.replace("{tenant}", tenant_id) for pattern in sources.s3_buckets]
        if not any(fnmatchcase(settings.bucket, pattern) for pattern in allowed):
            raise PermanentError(
                f"bucket '{settings.bucket}' is not one the deployment's credentials serve for this "
                "tenant (RAGLINE_SOURCES__S3_BUCKETS); give the source its own access_key_id and "
                "secret_access_key",
                code=ErrorCode.FORBIDDEN,
            )
    if not own_keys and settings.endpoint_url not in (None, sources.s3_endpoint_url):
        raise PermanentError(
            "a source that names its own endpoint_url gives its own access_key_id and "
            "secret_access_key: the deployment's credentials are sent to the deployment's store only",
            code=ErrorCode.FORBIDDEN,
        )
    if settings.endpoint_url is not None:
        target = check_url(settings.endpoint_url)
        policy = FetchPolicy.of(deployment.fetch.allow)
        policy.check_name(target)
        addresses = [target.literal] if target.literal is not None else resolve(target.host, target.port)
        policy.check_addresses(target.host, addresses)
    secret = settings.secret_access_key if own_keys else sources.s3_secret_access_key
    return S3Endpoint(
        endpoint_url=settings.endpoint_url or sources.s3_endpoint_url,
        region=settings.region or sources.s3_region,
        access_key_id=settings.access_key_id if own_keys else sources.s3_access_key_id,
        secret_access_key=secret.get_secret_value() if secret is not None else None,
        timeout_s=30.0,
    )


@contextlib.contextmanager
def _the_sources_store(bucket: str) -> Iterator[None]:
    """A failing store is the source's failure, not an outage of Ragline's own services."""
    try:
        yield
    except BucketMissing:
        raise RaglineError(f"the bucket '{bucket}' does not exist", code=ErrorCode.NOT_FOUND) from None
    except AccessRefused:
        raise RaglineError(
            f"the store refused access to bucket '{bucket}'", code=ErrorCode.FORBIDDEN
        ) from None
    except OutageError as error:
        raise RaglineError(error.message, code=ErrorCode.UNAVAILABLE) from None


class S3Connector(Connector):
    def __init__(self, settings: S3Settings, endpoint: S3Endpoint, max_bytes: int) -> None:
        self.settings = settings
        self.client: S3Client = make_client(endpoint)
        self.max_bytes = max_bytes
        self.where = f"source bucket {settings.bucket}"

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        bucket, prefix = self.settings.bucket, self.settings.prefix
        with _the_sources_store(bucket):
            for info in list_objects(self.client, bucket, prefix, self.where):
                relative = info.key[len(prefix) :].lstrip("/")
                if not relative or info.key.endswith("/"):
                    continue  # a "directory" marker
                if not selected(relative, self.settings.include, self.settings.exclude):
                    continue
                found = Found(
                    key=info.key,
                    uri=f"s3://{bucket}/{info.key}",
                    version=info.etag or None,
                    doc_id=safe_doc_id(relative),
                    filename=relative.rsplit("/", 1)[-1],
                )
                if info.size > self.max_bytes:
                    limit = f"the object exceeds the limit of {self.max_bytes} bytes"
                    found = replace(found, error=RaglineError(limit, code=ErrorCode.TOO_LARGE))
                yield found

    def read(self, item: Found) -> bytes:
        try:
            with _the_sources_store(self.settings.bucket):
                data = read_object(
                    self.client, self.settings.bucket, item.key, self.where, limit=self.max_bytes
                )
        except FileNotFoundError:
            raise RaglineError(
                "the object was deleted while the run listed the bucket", code=ErrorCode.NOT_FOUND
            ) from None
        if len(data) > self.max_bytes:
            raise RaglineError(
                f"the object exceeds the limit of {self.max_bytes} bytes", code=ErrorCode.TOO_LARGE
            )
        return data

    def close(self) -> None:
        self.client.close()

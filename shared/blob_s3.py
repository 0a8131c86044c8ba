"""The blob store in a bucket of an S3-compatible store, shared by an API and workers on any host.

Objects under the configured prefix: `blobs/ab/cd/<sha256>` and `artifacts/<key digest>.json`, the
layout of the directory store. A blob's digest is known only once all its bytes are in, so they
are spooled to a local file first and sent under their final name only then: a PUT (or, for a
large blob, a multipart upload completed last) shows the object whole or not at all, so a failed
upload leaves nothing a reader could see. Bytes already stored are not sent again.

The stripe locks live in Redis (shared/stripe_locks.py), since flock holds on one host only.
Failures are Ragline's own (shared/s3.py): a store that is down is an outage documents wait out.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import redis
from botocore.exceptions import ClientError

from shared import s3
from shared.blobs import (
    IDENTITY_MAX_CHARS,
    IDENTITY_NAME,
    LOCK_WAIT_S,
    BlobStore,
    StoredBlob,
    artifact_name,
    checked_digest,
    new_identity,
    spool,
)
from shared.config import BlobsSettings
from shared.errors import OutageError
from shared.stripe_locks import StripeLocks

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

# A PUT of one body up to this size; larger blobs go in parts of it (S3 wants parts of 5 MiB or
# more, and S3-compatible servers buffer a signed single body in memory to check its hash).
PART_BYTES = 16 << 20
_DELETE_BATCH = 1000  # the most keys one DeleteObjects request takes
_COPY_BYTES = 1 << 20
# A conditional write that found the store's id already written by another process.
_WRITTEN_BY_ANOTHER = {"PreconditionFailed", "ConditionalRequestConflict"}
# A readiness probe's question: one attempt, answered within this bound, so a probe never waits
# out the retries a document's request gets.
PROBE_TIMEOUT_S = 2.0


def endpoint_of(settings: BlobsSettings) -> s3.S3Endpoint:
    secret = settings.secret_access_key
    return s3.S3Endpoint(
        endpoint_url=settings.endpoint_url,
        region=settings.region,
        access_key_id=settings.access_key_id,
        secret_access_key=secret.get_secret_value() if secret is not None else None,
        timeout_s=settings.timeout_s,
    )


class S3BlobStore(BlobStore):
    """Blobs and artifacts in `settings.url`'s bucket and prefix; `scratch` holds local copies."""

    def __init__(self, settings: BlobsSettings, broker: redis.Redis, scratch: Path) -> None:
        self.bucket = settings.bucket
        self.prefix = settings.prefix
        self._where = "RAGLINE_BLOBS__URL"
        endpoint = endpoint_of(settings)
        self._s3: S3Client = s3.make_client(endpoint)
        self._probe: S3Client = s3.make_client(replace(endpoint, timeout_s=PROBE_TIMEOUT_S), attempts=1)
        self._scratch = scratch
        self.lock_namespace = f"ragline:blob-lock:{self.bucket}/{self.prefix}"
        self._locks = StripeLocks(broker, self.lock_namespace, wait_s=LOCK_WAIT_S)
        self._bucket_seen = False

    def _client(self) -> S3Client:
        """The client, once the bucket is known to exist: a missing one is a configuration error
        that the first request reports by name."""
        if not self._bucket_seen:
            s3.check_bucket(self._s3, self.bucket, self._where)
            self._bucket_seen = True
        return self._s3

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def identity(self) -> str:
        key = f"{self.prefix}{IDENTITY_NAME}"
        with contextlib.suppress(FileNotFoundError):
            return self._read_identity(key)
        self._create_identity(key)
        return self._read_identity(key)

    def _read_identity(self, key: str) -> str:
        found = s3.read_object(self._client(), self.bucket, key, self._where, limit=IDENTITY_MAX_CHARS)
        return found[:IDENTITY_MAX_CHARS].decode("ascii", "replace").strip()

    def _create_identity(self, key: str) -> None:
        """Written only if absent; a store without conditional writes takes a plain one, so two
        first writers race there and the last one stands, which every process reads at its next ask."""
        client, body = self._client(), new_identity().encode()
        with s3.translated(self.bucket, self._where):
            try:
                client.put_object(Bucket=self.bucket, Key=key, Body=body, IfNoneMatch="*")
            except ClientError as error:
                if s3.error_code(error) in _WRITTEN_BY_ANOTHER:
                    return
                if s3.error_code(error) != "NotImplemented":
                    raise
                client.put_object(Bucket=self.bucket, Key=key, Body=body)

    def check(self) -> None:
        s3.check_bucket(self._probe, self.bucket, self._where)

    def blob_key(self, sha256: str) -> str:
        checked_digest(sha256)
        return f"{self.prefix}blobs/{sha256[:2]}/{sha256[2:4]}/{sha256}"

    def _artifact_key(self, key: str) -> str:
        return f"{self.prefix}artifacts/{artifact_name(key)}"

    def _spool_file(self) -> IO[bytes]:
        self._scratch.mkdir(parents=True, exist_ok=True)
        return tempfile.TemporaryFile(dir=self._scratch)

    def put(self, data: bytes | Iterable[bytes], *, max_bytes: int | None = None) -> StoredBlob:
        with self._spool_file() as spooled:
            blob = spool(data, spooled, max_bytes)
            key = self.blob_key(blob.sha256)
            if s3.head_object(self._client(), self.bucket, key, self._where) is None:
                spooled.seek(0)
                self._upload(key, spooled, blob.size)
            return blob

    def _upload(self, key: str, body: IO[bytes], size: int) -> None:
        client = self._client()
        if size <= PART_BYTES:
            with s3.translated(self.bucket, self._where):
                client.put_object(Bucket=self.bucket, Key=key, Body=body.read())
            return
        with s3.translated(self.bucket, self._where):
            upload_id = client.create_multipart_upload(Bucket=self.bucket, Key=key)["UploadId"]
        try:
            parts: list[CompletedPartTypeDef] = []
            for number, chunk in enumerate(iter(lambda: body.read(PART_BYTES), b""), start=1):
                with s3.translated(self.bucket, self._where):
                    answer = client.upload_part(
                        Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=chunk
                    )
                parts.append({"ETag": answer["ETag"], "PartNumber": number})
            with s3.translated(self.bucket, self._where):
                client.complete_multipart_upload(
                    Bucket=self.bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            # The parts of an upload never completed are no object; abort frees them.
            with contextlib.suppress(Exception):
                client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
            raise

    def exists(self, sha256: str) -> bool:
        return s3.head_object(self._client(), self.bucket, self.blob_key(sha256), self._where) is not None

    def read(self, sha256: str) -> bytes:
        return s3.read_object(self._client(), self.bucket, self.blob_key(sha256), self._where)

    @contextlib.contextmanager
    def local_file(self, sha256: str) -> Iterator[Path]:
        key = self.blob_key(sha256)
        self._scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self._scratch) as folder:
            path = Path(folder) / sha256
            with s3.translated(self.bucket, self._where):
                body = self._client().get_object(Bucket=self.bucket, Key=key)["Body"]
                try:
                    with path.open("wb") as out:
                        for chunk in iter(lambda: body.read(_COPY_BYTES), b""):
                            out.write(chunk)
                finally:
                    body.close()
            yield path

    def _stripe_lock(self, stripe: str, *, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        return self._locks.exclusive(stripe) if exclusive else self._locks.shared(stripe)

    def _remove(self, sha256s: set[str]) -> None:
        self._delete([self.blob_key(sha) for sha in sorted(sha256s)])

    def _delete(self, keys: list[str]) -> None:
        client = self._client()
        for first in range(0, len(keys), _DELETE_BATCH):
            batch = keys[first : first + _DELETE_BATCH]
            with s3.translated(self.bucket, self._where):
                answer = client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                )
            failed = [e for e in answer.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                raise OutageError(
                    f"the S3 store did not delete {len(failed)} objects ({failed[0].get('Code')})"
                )

    def put_artifact(self, key: str, value: Any) -> None:
        body = json.dumps(value, ensure_ascii=False).encode()
        with s3.translated(self.bucket, self._where):
            self._client().put_object(
                Bucket=self.bucket, Key=self._artifact_key(key), Body=body, ContentType="application/json"
            )

    def get_artifact(self, key: str) -> Any:
        return json.loads(s3.read_object(self._client(), self.bucket, self._artifact_key(key), self._where))

    def has_artifact(self, key: str) -> bool:
        return s3.head_object(self._client(), self.bucket, self._artifact_key(key), self._where) is not None

    def drop_artifacts(self, keys: Iterable[str]) -> None:
        names = [self._artifact_key(key) for key in keys]
        if names:
            self._delete(names)

"""A second process that holds a lock of the S3 blob store until told to let go, for the tests of
locks across processes (tests/integration/test_s3_blob_store.py).

Usage: python -m tests.integration.blob_holder pin|remove|expiring SHA256
  pin       holds `store.pinned(SHA256)`
  remove    holds the exclusive lock of `store.remove_unused([SHA256])` (inside its `needed`, which
            keeps the blob)
  expiring  holds the stripe exclusively through StripeLocks with a one-second expiry
It prints `held` once it holds the lock, lets go at a line on stdin, then prints `released`.
The blob store is the one RAGLINE_BLOBS__* configures.
"""

from __future__ import annotations

import sys

from shared.blob_s3 import S3BlobStore
from shared.config import load_settings
from shared.queue import redis_client
from shared.stripe_locks import StripeLocks
from shared.wiring import blob_store


def _held() -> None:
    print("held", flush=True)
    sys.stdin.readline()


def main(action: str, sha256: str) -> None:
    settings = load_settings()
    broker = redis_client(settings)
    store = blob_store(settings, broker)
    assert isinstance(store, S3BlobStore), "RAGLINE_BLOBS__URL must name an s3:// bucket"
    if action == "pin":
        with store.pinned(sha256):
            _held()
    elif action == "remove":

        def needed(blobs: list[str]) -> set[str]:
            _held()
            return set(blobs)

        store.remove_unused([sha256], needed)
    elif action == "expiring":
        with StripeLocks(broker, store.lock_namespace, ttl_s=1.0).exclusive(sha256[:2]):
            _held()
    else:
        raise SystemExit(f"unknown action {action}")
    print("released", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""An `s3` source against a store that lies: a loopback HTTP server speaking enough of the S3 API
(a listing, a GET) whose listing says an object is small and whose GET sends far more. The
connector must stop reading at its limit, whatever the listing said: the worker's main process
holds what it reads."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.s3 import S3Endpoint
from shared.sources.models import S3Settings
from workers.sources.connector import Found
from workers.sources.s3 import S3Connector

BUCKET = "lying-store"
SENT_BYTES = 64 << 20  # well beyond what loopback socket buffers hold unread
LIMIT = 64 << 10
_LISTING = f"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Name>{BUCKET}</Name><Prefix></Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys>
<IsTruncated>false</IsTruncated>
<Contents><Key>small.txt</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>
<ETag>"0123456789abcdef0123456789abcdef"</ETag><Size>10</Size><StorageClass>STANDARD</StorageClass></Contents>
</ListBucketResult>""".encode()


class LyingStore:
    def __init__(self) -> None:
        self.written = 0
        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                if "list-type=2" in self.path:
                    self._answer(_LISTING, "application/xml")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(SENT_BYTES))
                self.send_header("ETag", '"0123456789abcdef0123456789abcdef"')
                self.end_headers()
                piece = b"x" * (1 << 16)
                try:
                    while store.written < SENT_BYTES:
                        self.wfile.write(piece)
                        store.written += len(piece)
                except OSError:
                    pass  # the client hung up: what it read is what was written

            def _answer(self, body: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def store() -> Iterator[LyingStore]:
    served = LyingStore()
    yield served
    served.server.shutdown()
    served.server.server_close()


def test_an_object_larger_than_its_listing_said_is_read_only_to_the_limit(store: LyingStore) -> None:
    settings = S3Settings.model_validate(
        {"bucket": BUCKET, "access_key_id": "k", "secret_access_key": "s", "endpoint_url": store.url}
    )
    endpoint = S3Endpoint(store.url, "us-east-1", "k", "s", timeout_s=10.0)
    connector = S3Connector(settings, endpoint, LIMIT)
    try:
        (item,) = list(connector.scan({}, "run"))
        assert isinstance(item, Found)
        assert item.error is None  # the listing's 10 bytes are within the limit
        with pytest.raises(RaglineError) as error:
            connector.read(item)
    finally:
        connector.close()
    assert error.value.code == ErrorCode.TOO_LARGE
    # Read whole before the size check, the object filled memory with all it was sent; stopped at
    # the limit, the server could write no more than the socket buffers took.
    assert store.written <= SENT_BYTES // 2

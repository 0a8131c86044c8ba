"""Helpers of the end-to-end tests: the server handle and polling like a user."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import pytest

MAX_FILE_BYTES = 256 * 1024  # the test server's per-file limit


@dataclass(frozen=True)
class Server:
    url: str
    keys: dict[str, str]  # name -> secret: a_admin, a_read, b_admin

    def client(self, key: str | None) -> httpx.Client:
        headers = {"X-Api-Key": self.keys[key]} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


def wait_ready(
    client: httpx.Client, kb_id: str, doc_ids: list[str], timeout_s: float = 300
) -> dict[str, dict[str, object]]:
    """Poll GET .../documents/{doc_id} like a user until every document is ready or failed."""
    deadline = time.monotonic() + timeout_s
    docs: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        docs = {d: client.get(f"/v1/kbs/{kb_id}/documents/{d}").json() for d in doc_ids}
        if all(doc.get("status") in ("ready", "failed") for doc in docs.values()):
            return docs
        time.sleep(0.5)
    pytest.fail(f"not terminal after {timeout_s}s: { {d: v.get('status') for d, v in docs.items()} }")

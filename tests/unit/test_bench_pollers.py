"""The bench's status pollers tell a document not accepted yet (404) from a failed request."""

from __future__ import annotations

import time

from bench.pollers import Pollers
from client.http import ApiError


def test_failed_polls_are_counted_by_kind() -> None:
    def poll(doc_id: str) -> object:
        if doc_id == "not-yet":
            raise ApiError(404, "NOT_FOUND", "no such document")
        if doc_id == "broken":
            raise ConnectionError("refused")
        return {"status": "ready"}

    with Pollers(8, poll, ["not-yet", "broken", "ready"]) as pollers:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (len(pollers.errors) == 2 and pollers.latencies_ms):
            time.sleep(0.1)
    assert set(pollers.errors) == {"404 NOT_FOUND", "ConnectionError"}
    assert pollers.latencies_ms

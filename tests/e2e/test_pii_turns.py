"""A document of megabytes is analyzed for personal data in turns: between two, its worker process
takes what waits in the queue. Another tenant's one-line upload waited for the whole analysis
(minutes for a few megabytes) before.

A worker of the test's own (one process) with turns of a second, so a text of a few windows
outlasts several turns on any CPU; the stack's worker keeps the deployment's 30 s."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared.config import Settings
from shared.models import PIPELINE, Stage
from tests.e2e.helpers import Server, wait_ready
from tests.e2e.own_stack import own_stack

pytestmark = pytest.mark.e2e

REDIS_DB = 10  # the stack uses 0, the other own stacks 11, 12 and 14, the quiet tests 13
WINDOWS = 6  # of the stage's 100,000 characters each


@pytest.fixture(scope="module")
def turning(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Server]:
    env = {"RAGLINE_PII__TURN_S": "1", "RAGLINE_API__MAX_FILE_BYTES": str(4 << 20)}
    with own_stack(tmp_path_factory.mktemp("pii-turns"), settings, REDIS_DB, env) as stack:
        yield stack.server


def _doc(client: httpx.Client, kb: str, doc_id: str) -> dict[str, Any]:
    answer = client.get(f"/v1/kbs/{kb}/documents/{doc_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def test_another_tenants_document_is_not_held_behind_a_huge_analysis(turning: Server) -> None:
    run = secrets.token_hex(6)  # texts no earlier run cached
    big_kb, small_kb = f"pii-big-{run}", f"pii-small-{run}"
    lines = [
        f"Entry {n} ({run}): harbour berth{n % 97} cargo{n % 89} tide; write to clerk{n}@example.com."
        for n in range(WINDOWS * 100_000 // 80)
    ]
    big = "\n".join(lines).encode()
    with turning.client("a_admin") as a, turning.client("b_admin") as b:
        for client, kb in ((a, big_kb), (b, small_kb)):
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
        try:
            sent = a.post(
                f"/v1/kbs/{big_kb}/documents", files={"files": ("big.txt", big)}, data={"doc_id": "big"}
            )
            assert sent.status_code == 202, sent.text
            deadline = time.monotonic() + 300
            while (status := _doc(a, big_kb, "big")["status"]) != "redacting":
                assert status in {"queued", "parsing", "chunking", "enriching"}, status
                assert time.monotonic() < deadline, status
                time.sleep(0.2)

            note = f"The harbour master's note {run}.".encode()
            sent = b.post(
                f"/v1/kbs/{small_kb}/documents", files={"files": ("note.txt", note)}, data={"doc_id": "note"}
            )
            assert sent.status_code == 202, sent.text
            ready = wait_ready(b, small_kb, ["note"], timeout_s=300)["note"]
            big_now = _doc(a, big_kb, "big")

            assert ready["status"] == "ready", ready
            # Ready while the big document's analysis goes on: its turn ended to let the note by,
            # and its progress moved through the stage by the windows analyzed.
            assert big_now["status"] == "redacting", big_now
            analysis_began = PIPELINE.index(Stage.PII) / len(PIPELINE)
            assert float(big_now["progress"]) > analysis_began + 0.001, big_now
            assert "turns" not in big_now["stats"], big_now  # the embed stage's, not this one's
        finally:
            for client, kb in ((a, big_kb), (b, small_kb)):
                client.delete(f"/v1/kbs/{kb}")  # the big document goes too; its next turn finds it gone

"""A document of thousands of chunks embeds in turns: between two, its worker process takes what
waits in the interactive queue. Another tenant's one-line document, uploaded while the big ones
held every process, waited for the whole of their embedding before."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator

import httpx
import pytest

from shared.config import Settings
from shared.models import PIPELINE, Stage
from tests.e2e.helpers import Server, start_server, stop_server, wait_ready

pytestmark = pytest.mark.e2e

# Entries of about 200 tokens: a document of some 5,000 chunks, whose embedding outlasts several
# turns (`embedding.turn_s`) on any CPU.
BIG_ENTRIES = 3000


def _status(client: httpx.Client, kb: str, doc_id: str) -> str:
    return str(client.get(f"/v1/kbs/{kb}/documents/{doc_id}").json().get("status"))


@pytest.fixture(scope="module")
def roomy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """An API that takes files of several megabytes (the session's server takes 256 KiB)."""
    handle, process = start_server(
        tmp_path_factory.mktemp("api"), {"RAGLINE_API__MAX_FILE_BYTES": str(16 << 20)}
    )
    yield handle
    stop_server(process)


@pytest.fixture
def kbs(roomy: Server) -> Iterator[tuple[str, str]]:
    server = roomy
    names = (f"turns-a-{secrets.token_hex(4)}", f"turns-b-{secrets.token_hex(4)}")
    with server.client("a_admin") as a, server.client("b_admin") as b:
        for client, kb in ((a, names[0]), (b, names[1])):
            body = {"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}  # to embedding sooner
            assert client.post("/v1/kbs", json=body).status_code == 201
        yield names
        for client, kb in ((a, names[0]), (b, names[1])):
            client.delete(f"/v1/kbs/{kb}")  # the big documents go too; their next turn finds them gone


def test_a_small_document_is_not_held_behind_huge_ones(
    roomy: Server, settings: Settings, kbs: tuple[str, str]
) -> None:
    server = roomy
    big_kb, small_kb = kbs
    run = secrets.token_hex(6)  # texts no earlier run cached
    bigs = [f"big-{n}.txt" for n in range(settings.celery.worker_concurrency)]
    with server.client("a_admin") as a, server.client("b_admin") as b:
        for name in bigs:  # one for each worker process
            text = "\n\n".join(
                f"Entry {n} of {name} ({run}): "
                + " ".join(f"berth{n % 97} cargo{n % 89} tide{i}" for i in range(30))
                for n in range(BIG_ENTRIES)
            )
            sent = a.post(
                f"/v1/kbs/{big_kb}/documents", files={"files": (name, text.encode())}, data={"doc_id": name}
            )
            assert sent.status_code == 202, sent.text
        deadline = time.monotonic() + 600
        while not all(_status(a, big_kb, name) == "embedding" for name in bigs):
            assert time.monotonic() < deadline, {name: _status(a, big_kb, name) for name in bigs}
            time.sleep(0.5)

        sent = b.post(
            f"/v1/kbs/{small_kb}/documents",
            files={"files": ("note.txt", f"The harbour master's note {run}.".encode())},
            data={"doc_id": "note.txt"},
        )
        assert sent.status_code == 202, sent.text
        note = wait_ready(b, small_kb, ["note.txt"], timeout_s=600)["note.txt"]
        bigs_now = {name: a.get(f"/v1/kbs/{big_kb}/documents/{name}").json() for name in bigs}
        big_statuses = {name: str(doc["status"]) for name, doc in bigs_now.items()}

    assert note["status"] == "ready", note
    # Ready within a turn or two, while the big documents are still being embedded.
    assert set(big_statuses.values()) == {"embedding"}, big_statuses
    # A process freed for the note means a big document's turn ended: its progress moved on from
    # where the embedding began (it stood there until the last turn).
    embedding_began = PIPELINE.index(Stage.EMBED) / len(PIPELINE)
    assert max(float(doc["progress"]) for doc in bigs_now.values()) > embedding_began + 0.001, bigs_now
    assert any(doc["stats"].get("turns", {}).get("count", 0) >= 1 for doc in bigs_now.values()), bigs_now

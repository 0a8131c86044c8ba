"""A knowledge base's deletion takes everything added to it while it runs: a source or a document
added in that moment outlived the KB, and a new KB of the same id got them (the source's next run
brought the deleted KB's documents back; the document was searchable there)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from shared.config import Settings
from shared.search.client import build_client
from tests.e2e.helpers import Server, tenant_of

pytestmark = pytest.mark.e2e

ROUNDS = 4

Add = Callable[[httpx.Client, str, int], httpx.Response]


class Adder(threading.Thread):
    """Adds to `kb` one thing after another until told to stop; keeps the answers."""

    def __init__(self, server: Server, kb: str, add: Add) -> None:
        super().__init__()
        self.server, self.kb, self.add = server, kb, add
        self.answered: list[int] = []
        self.started_adding, self.stop = threading.Event(), threading.Event()

    def run(self) -> None:
        # Its own client: the deletion holds the test's connection meanwhile.
        with self.server.client("a_admin") as client:
            n = 0
            while not self.stop.is_set():
                self.answered.append(self.add(client, self.kb, n).status_code)
                self.started_adding.set()
                n += 1


def _race_deletions(server: Server, add: Add, accepted: int) -> list[str]:
    """Delete KBs while `add` runs against them; re-create each and return the new KBs' ids."""
    recreated = []
    with server.client("a_admin") as client:
        for _ in range(ROUNDS):
            kb = f"kbdel-{secrets.token_hex(4)}"
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
            adder = Adder(server, kb, add)
            adder.start()
            try:
                assert adder.started_adding.wait(60)
                deleted = client.delete(f"/v1/kbs/{kb}")
            finally:
                adder.stop.set()
                adder.join(60)
            assert deleted.status_code == 204, deleted.text
            assert set(adder.answered) <= {accepted, 404, 409}, adder.answered
            assert accepted in adder.answered  # the adds were under way while the KB went
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
            recreated.append(kb)
    return recreated


def test_sources_added_while_their_kb_is_deleted_go_with_it(server: Server, folder: Path) -> None:
    (folder / "page.txt").write_text("The harbour log of the deleted knowledge base.")

    def add(client: httpx.Client, kb: str, n: int) -> httpx.Response:
        body = {"type": "folder", "source_id": f"s{n}", "settings": {"path": str(folder)}}
        return client.post(f"/v1/kbs/{kb}/sources", json=body)

    with server.client("a_admin") as client:
        for kb in _race_deletions(server, add, accepted=201):
            listed = client.get(f"/v1/kbs/{kb}/sources")
            assert listed.status_code == 200, listed.text
            assert listed.json()["sources"] == []  # a KB of the same id starts with none
            assert client.get(f"/v1/kbs/{kb}/sources/s0").status_code == 404
            client.delete(f"/v1/kbs/{kb}")


def test_documents_uploaded_while_their_kb_is_deleted_go_with_it(server: Server) -> None:
    marker = f"quokka{secrets.token_hex(4)}"

    def add(client: httpx.Client, kb: str, n: int) -> httpx.Response:
        text = f"Upload {n}: the {marker} harbour log of the deleted knowledge base."
        return client.post(f"/v1/kbs/{kb}/documents", files={"files": (f"u{n}.txt", text.encode())})

    recreated = _race_deletions(server, add, accepted=202)
    with server.client("a_admin") as client:
        for kb in recreated:
            listed = client.get(f"/v1/kbs/{kb}/documents")
            assert listed.status_code == 200, listed.text
            assert listed.json()["documents"] == []  # a KB of the same id starts with none
            assert client.get(f"/v1/kbs/{kb}").json()["document_count"] == 0
            assert client.get(f"/v1/kbs/{kb}/documents/u0.txt").status_code == 404
        # Whatever the workers still had of the deleted KBs' uploads, none of it is found now.
        found = client.post("/v1/search", json={"query": marker, "kb_ids": recreated, "mode": "keyword"})
        assert found.status_code == 200, found.text
        assert found.json()["results"] == []
        for kb in recreated:
            client.delete(f"/v1/kbs/{kb}")


def test_a_kb_created_again_during_the_deletion_keeps_what_it_is_given(server: Server) -> None:
    """The deletion's last sweep ran after the KB record was gone, when a create of the same id
    already succeeded: it deleted what the new KB was given (12 of 19 uploads, seen)."""
    with server.client("a_admin") as client:
        for _ in range(2):
            kb = f"kbre-{secrets.token_hex(4)}"
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
            for n in range(40):  # work for the deletion's sweeps
                client.post(
                    f"/v1/kbs/{kb}/documents", files={"files": (f"old{n}.txt", f"old text {n}".encode())}
                )
            adder = Adder(
                server,
                kb,
                lambda c, k, n: c.post(f"/v1/kbs/{k}/documents", files={"files": (f"w{n}.txt", b"x")}),
            )
            adder.start()
            assert adder.started_adding.wait(60)
            answers: list[httpx.Response] = []
            deleter = threading.Thread(target=_delete, args=(server, kb, answers))
            deleter.start()
            kept = _create_again_and_upload(server, kb)
            deleter.join(120)
            adder.stop.set()
            adder.join(60)
            assert [a.status_code for a in answers] == [204], [a.text for a in answers]
            for doc_id in kept:  # every upload the new KB accepted is there
                assert client.get(f"/v1/kbs/{kb}/documents/{doc_id}").status_code == 200, doc_id
            assert client.get(f"/v1/kbs/{kb}/documents/old0.txt").status_code == 404
            client.delete(f"/v1/kbs/{kb}")


def _delete(server: Server, kb: str, answers: list[httpx.Response]) -> None:
    with server.client("a_admin") as client:
        answers.append(client.delete(f"/v1/kbs/{kb}"))


def _create_again_and_upload(server: Server, kb: str) -> list[str]:
    """As a client that re-creates the KB the moment it reads as gone: create (again while the
    deletion answers UNAVAILABLE), then upload; returns the documents the new KB accepted."""
    kept: list[str] = []
    with server.client("a_admin") as client:
        while client.get(f"/v1/kbs/{kb}").status_code != 404:
            time.sleep(0.02)
        while (created := client.post("/v1/kbs", json={"kb_id": kb, "name": kb})).status_code != 201:
            assert created.status_code in (409, 503), created.text  # the old one, or its deletion
            time.sleep(0.05)
        for n in range(10):
            added = client.post(
                f"/v1/kbs/{kb}/documents", files={"files": (f"new{n}.txt", f"new {n}".encode())}
            )
            assert added.status_code == 202, added.text
            kept.append(f"new{n}.txt")
    return kept


def test_chunks_stored_while_their_kb_is_deleted_go_with_it(server: Server, settings: Settings) -> None:
    """A store in flight when the KB went wrote its chunks after the deletion's: they stayed in the
    shared index, and a new KB of the same id found the old text."""
    tenant = tenant_of(server, "a_admin")
    opensearch = build_client(settings.opensearch)
    text = "\n\n".join(f"Paragraph {n} of the capybara ledger, kept for the audit." for n in range(1500))
    with server.client("a_admin") as client:
        for _ in range(2):
            kb = f"kbst-{secrets.token_hex(4)}"
            body = {"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}
            assert client.post("/v1/kbs", json=body).status_code == 201
            client.post(f"/v1/kbs/{kb}/documents", files={"files": ("big.txt", text.encode())})
            deadline = time.monotonic() + 300
            while (
                status := client.get(f"/v1/kbs/{kb}/documents/big.txt").json().get("status")
            ) != "indexing":
                assert status not in ("ready", "failed"), status  # the store was not caught under way
                assert time.monotonic() < deadline
            assert client.delete(f"/v1/kbs/{kb}").status_code == 204
            time.sleep(3)  # the worker's store and hand-over end
            opensearch.indices.refresh(index=f"{settings.opensearch.index_prefix}-chunks-*")
            left = opensearch.count(
                index=f"{settings.opensearch.index_prefix}-chunks-*",
                body={
                    "query": {"bool": {"filter": [{"term": {"tenant_id": tenant}}, {"term": {"kb_id": kb}}]}}
                },
            )["count"]
            assert left == 0, (kb, left)

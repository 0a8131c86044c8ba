"""A knowledge base's deletion takes every source with it, those added while it runs included: one
added in that moment outlived the KB, and a new KB of the same id got it and, at its next run, the
deleted KB's documents back."""

from __future__ import annotations

import secrets
import threading
from pathlib import Path

import pytest

from tests.e2e.helpers import Server

pytestmark = pytest.mark.e2e

ROUNDS = 4


class Adder(threading.Thread):
    """Adds folder sources to `kb` one after another until told to stop; keeps the answers."""

    def __init__(self, server: Server, kb: str, folder: Path) -> None:
        super().__init__()
        self.server, self.kb, self.folder = server, kb, folder
        self.answered: list[int] = []
        self.started_adding, self.stop = threading.Event(), threading.Event()

    def run(self) -> None:
        # Its own client: the deletion holds the test's connection meanwhile.
        with self.server.client("a_admin") as client:
            n = 0
            while not self.stop.is_set():
                body = {"type": "folder", "source_id": f"s{n}", "settings": {"path": str(self.folder)}}
                self.answered.append(client.post(f"/v1/kbs/{self.kb}/sources", json=body).status_code)
                self.started_adding.set()
                n += 1


def test_sources_added_while_their_kb_is_deleted_go_with_it(server: Server, folder: Path) -> None:
    (folder / "page.txt").write_text("The harbour log of the deleted knowledge base.")
    with server.client("a_admin") as client:
        for _ in range(ROUNDS):
            kb = f"srcdel-{secrets.token_hex(4)}"
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
            adder = Adder(server, kb, folder)
            adder.start()
            try:
                assert adder.started_adding.wait(60)
                deleted = client.delete(f"/v1/kbs/{kb}")
            finally:
                adder.stop.set()
                adder.join(60)
            assert deleted.status_code == 204, deleted.text
            assert set(adder.answered) <= {201, 404, 409}, adder.answered
            assert 201 in adder.answered  # the adds were under way while the KB went
            # Its sources went with it, whenever they were added: a KB of the same id has none.
            assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
            listed = client.get(f"/v1/kbs/{kb}/sources")
            assert listed.status_code == 200, listed.text
            assert listed.json()["sources"] == []
            assert client.get(f"/v1/kbs/{kb}/sources/s0").status_code == 404
            client.delete(f"/v1/kbs/{kb}")

"""The `folder` source through the real API, worker and stores: first sync, a change, a deletion, an
unchanged re-sync that does no work, and a run resumed after its worker was killed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.config import Settings
from tests.e2e.helpers import Server
from tests.e2e.sources import add, counts, documents, kill_worker_mid_run, new_kb, sync, wait_run

pytestmark = pytest.mark.e2e


@pytest.fixture
def kb(server: Server) -> Iterator[str]:
    yield from new_kb(server, "src")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_folder_source_follows_its_folder(server: Server, folder: Path, kb: str) -> None:
    _write(folder / "guide" / "install.md", "# Install\n\nRun the installer, then reboot the kingfisher.")
    _write(folder / "guide" / "usage.md", "# Usage\n\nThe pelican command sorts herrings by weight.")
    _write(folder / "notes.txt", "Cormorants dry their wings on the harbour wall.")
    _write(folder / ".hidden" / "secret.txt", "left out by the default exclude")
    with server.client("a_admin") as client:
        source = add(client, kb, {"type": "folder", "source_id": "docs", "settings": {"path": str(folder)}})
        assert source["settings"]["path"] == str(folder)

        first = sync(client, kb, "docs")
        assert first["status"] == "succeeded", first
        assert counts(first) == {"created": 3}
        docs = documents(client, kb)
        assert set(docs) == {"guide/install.md", "guide/usage.md", "notes.txt"}
        assert all(d["status"] == "ready" for d in docs.values()), docs
        hit = client.post("/v1/search", json={"query": "pelican herrings", "kb_ids": [kb], "top_k": 1}).json()
        assert hit["results"][0]["doc_id"] == "guide/usage.md"
        assert hit["results"][0]["source_uri"] == (folder / "guide" / "usage.md").as_uri()
        status = client.get(f"/v1/kbs/{kb}/documents/guide/usage.md").json()
        assert status["source_id"] == "docs"

        # A change (new content, new mtime), a deletion and a new file.
        _write(folder / "guide" / "usage.md", "# Usage\n\nThe pelican command now sorts sprats as well.")
        future = time.time() + 5
        os.utime(folder / "guide" / "usage.md", (future, future))
        (folder / "notes.txt").unlink()
        _write(folder / "faq.md", "# FAQ\n\nGannets dive at sixty miles an hour.")
        second = sync(client, kb, "docs")
        assert counts(second) == {"updated": 1, "deleted": 1, "created": 1, "unchanged": 1}, second
        docs = documents(client, kb)
        assert set(docs) == {"guide/install.md", "guide/usage.md", "faq.md"}
        assert client.get(f"/v1/kbs/{kb}/documents/notes.txt").json()["status"] == "deleted"
        found = client.post("/v1/search", json={"query": "cormorants harbour", "kb_ids": [kb]}).json()
        assert all(h["doc_id"] != "notes.txt" for h in found["results"])
        assert (
            "sprats"
            in client.post("/v1/search", json={"query": "pelican sprats", "kb_ids": [kb], "top_k": 1}).json()[
                "results"
            ][0]["text"]
        )

        # Nothing changed: no document is submitted again, none changes version.
        versions = {d: v["content_version"] for d, v in docs.items()}
        third = sync(client, kb, "docs")
        assert counts(third) == {"unchanged": 3}, third
        assert third["failures"] == []
        assert {d: v["content_version"] for d, v in documents(client, kb).items()} == versions
        batch = client.get(f"/v1/batches/{third['run_id']}")  # the unchanged run submitted nothing
        assert (batch.status_code, batch.json()["total"], batch.json()["done"]) == (200, 0, True), batch.text
        assert client.get(f"/v1/batches/{second['run_id']}").json()["total"] == 2

        listed = client.get(f"/v1/kbs/{kb}/sources").json()["sources"]
        assert [s["source_id"] for s in listed] == ["docs"]
        assert listed[0]["last_run"]["run_id"] == third["run_id"]
        runs = client.get(f"/v1/kbs/{kb}/sources/docs/runs").json()["runs"]
        assert [r["run_id"] for r in runs] == [third["run_id"], second["run_id"], first["run_id"]]

        # Another disk mounted in its place: the run would delete all three documents, so it
        # fails and deletes nothing, though it ingests what it found; and the next run, whose
        # share (3 of 6) would pass, is held too, until a run is allowed to delete.
        for path in (folder / "guide" / "install.md", folder / "guide" / "usage.md", folder / "faq.md"):
            path.unlink()
        for name in ("x.txt", "y.txt", "z.txt"):
            _write(folder / "other" / name, f"Another disk's file {name}.")
        swapped = sync(client, kb, "docs")
        assert (swapped["status"], swapped["error"]["code"]) == ("failed", "CONFLICT"), swapped
        assert "would delete 3 of the source's 3 documents" in swapped["error"]["message"]
        assert counts(swapped) == {"created": 3}, swapped
        again = sync(client, kb, "docs")
        assert (again["status"], again["error"]["code"]) == ("failed", "CONFLICT"), again
        assert "held" in again["error"]["message"]
        assert client.get(f"/v1/kbs/{kb}/sources/docs").json()["deletions_held"] is True
        assert len(documents(client, kb)) == 6
        allowed = client.post(f"/v1/kbs/{kb}/sources/docs/sync", params={"allow_deletions": "true"})
        assert allowed.status_code == 202, allowed.text
        assert allowed.json()["allow_deletions"] is True
        cleared = wait_run(client, kb, "docs", allowed.json()["run_id"])
        assert counts(cleared) == {"deleted": 3, "unchanged": 3}, cleared
        assert set(documents(client, kb)) == {"other/x.txt", "other/y.txt", "other/z.txt"}
        assert client.get(f"/v1/kbs/{kb}/sources/docs").json()["deletions_held"] is False


def test_an_upload_and_a_source_never_take_each_others_documents(
    server: Server, folder: Path, kb: str
) -> None:
    _write(folder / "shared.txt", "The osprey owns this one.")
    with server.client("a_admin") as client:
        uploaded = client.post(
            f"/v1/kbs/{kb}/documents", json={"content": "An upload owns this one.", "doc_id": "shared.txt"}
        )
        assert uploaded.status_code == 202, uploaded.text
        add(client, kb, {"type": "folder", "source_id": "mine", "settings": {"path": str(folder)}})
        run = sync(client, kb, "mine")
        assert (run["status"], counts(run)) == ("completed_with_errors", {"failed": 1}), run
        assert run["failures"][0]["code"] == "CONFLICT"
        assert "belongs to an upload" in run["failures"][0]["message"]
        # With a prefix the two live side by side.
        add(
            client,
            kb,
            {
                "type": "folder",
                "source_id": "prefixed",
                "doc_id_prefix": "osprey/",
                "settings": {"path": str(folder)},
            },
        )
        assert counts(sync(client, kb, "prefixed")) == {"created": 1}
        refused = client.post(
            f"/v1/kbs/{kb}/documents", json={"content": "overwrite", "doc_id": "osprey/shared.txt"}
        )
        assert refused.status_code == 409, refused.text


def test_removing_a_source_deletes_its_documents_unless_kept(server: Server, folder: Path, kb: str) -> None:
    _write(folder / "a.txt", "Puffins nest in burrows.")
    _write(folder / "b.txt", "Terns migrate pole to pole.")
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "gone", "settings": {"path": str(folder)}})
        add(
            client,
            kb,
            {"type": "folder", "source_id": "kept", "doc_id_prefix": "k/", "settings": {"path": str(folder)}},
        )
        assert counts(sync(client, kb, "gone")) == {"created": 2}
        assert counts(sync(client, kb, "kept")) == {"created": 2}
        removal = client.delete(f"/v1/kbs/{kb}/sources/gone")
        assert removal.status_code == 202, removal.text
        assert (
            client.delete(f"/v1/kbs/{kb}/sources/kept", params={"keep_documents": "true"}).status_code == 204
        )
        deadline = time.monotonic() + 120
        while client.get(f"/v1/kbs/{kb}/sources/gone").status_code != 404:
            assert time.monotonic() < deadline, "the removal did not finish"
            time.sleep(0.3)
        assert set(documents(client, kb)) == {"k/a.txt", "k/b.txt"}
        assert client.get(f"/v1/kbs/{kb}/sources").json()["sources"] == []
        # Kept, they are uploads: they named the forgotten source, an upload over one was refused
        # CONFLICT, and a source added again under its id took them, and deleted them with it.
        deadline = time.monotonic() + 120
        while any(d.get("source_id") for d in documents(client, kb).values()):
            assert time.monotonic() < deadline, documents(client, kb)
            time.sleep(0.3)
        replaced = client.post(
            f"/v1/kbs/{kb}/documents", json={"content": "Terns rest.", "doc_id": "k/b.txt"}
        )
        assert replaced.status_code == 202, replaced.text
        assert replaced.json()["documents"][0]["outcome"] == "updated"
        empty = folder / "empty"
        empty.mkdir()
        add(
            client,
            kb,
            {"type": "folder", "source_id": "kept", "doc_id_prefix": "k/", "settings": {"path": str(empty)}},
        )
        assert client.delete(f"/v1/kbs/{kb}/sources/kept").status_code == 202
        while client.get(f"/v1/kbs/{kb}/sources/kept").status_code != 404:
            assert time.monotonic() < deadline, "the removal did not finish"
            time.sleep(0.3)
        assert set(documents(client, kb)) == {"k/a.txt", "k/b.txt"}


@pytest.mark.parametrize(
    ("given", "code", "status"),
    [
        ({"path": "/etc"}, "FORBIDDEN", 403),
        ({"path": "relative/dir"}, "INVALID_ARGUMENT", 422),
    ],
)
def test_a_folder_outside_the_roots_is_refused(
    server: Server, kb: str, folder: Path, given: dict[str, str], code: str, status: int
) -> None:
    with server.client("a_admin") as client:
        refused = client.post(f"/v1/kbs/{kb}/sources", json={"type": "folder", "settings": given})
        assert (refused.status_code, refused.json()["code"]) == (status, code), refused.text
        if code == "FORBIDDEN":  # it says where a source may read
            assert str(folder.parent) in refused.json()["message"], refused.text
        assert (
            client.post(
                f"/v1/kbs/{kb}/sources", json={"type": "folder", "settings": {"path": "/x"}, "bogus": 1}
            ).status_code
            == 422
        )
    with server.client("a_read") as client:
        assert (
            client.post(
                f"/v1/kbs/{kb}/sources", json={"type": "folder", "settings": {"path": "/x"}}
            ).status_code
            == 403
        )


def test_a_run_with_retry_failed_ingests_the_failed_documents_again(
    server: Server, folder: Path, kb: str
) -> None:
    _write(folder / "a.txt", "Oystercatchers probe the mud for worms.")
    _write(folder / "blank.txt", " \n\n ")  # EMPTY_DOCUMENT, every time
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "docs", "settings": {"path": str(folder)}})
        assert counts(sync(client, kb, "docs")) == {"created": 2}
        first = documents(client, kb)["blank.txt"]
        assert (first["status"], first["error"]["code"]) == ("failed", "EMPTY_DOCUMENT"), first
        assert counts(sync(client, kb, "docs")) == {"unchanged": 1, "failed": 1}

        retried = sync(client, kb, "docs", retry_failed=True)
        assert retried["retry_failed"] is True
        assert (retried["status"], counts(retried)) == ("succeeded", {"unchanged": 1, "updated": 1}), retried
        again = documents(client, kb)["blank.txt"]  # the same bytes: it fails the same way
        assert (again["status"], again["content_version"]) == ("failed", first["content_version"] + 1), again
        batch = client.get(f"/v1/batches/{retried['run_id']}").json()
        assert (batch["total"], batch["done"]) == (1, True), batch
        assert [f["doc_id"] for f in batch["failures"]] == ["blank.txt"], batch


def test_a_path_with_a_nul_character_is_refused_when_the_source_is_added(
    server: Server, kb: str, folder: Path
) -> None:
    # Inside the roots, so only the NUL refuses it: it was added, and its runs failed INTERNAL.
    with server.client("a_admin") as client:
        refused = client.post(
            f"/v1/kbs/{kb}/sources", json={"type": "folder", "settings": {"path": f"{folder}/a\x00b"}}
        )
        assert (refused.status_code, refused.json()["code"]) == (422, "INVALID_ARGUMENT"), refused.text
        assert client.get(f"/v1/kbs/{kb}/sources").json()["sources"] == []


def test_a_run_whose_worker_is_killed_is_resumed_and_counts_each_item_once(
    server: Server, folder: Path, kb: str, settings: Settings
) -> None:
    total = 500
    for n in range(total):
        _write(
            folder / f"part-{n // 100}" / f"note-{n:04d}.txt",
            f"Field note {n}: a heron stood in reed bed {n}.",
        )
    with server.client("a_admin") as client:
        add(client, kb, {"type": "folder", "source_id": "many", "settings": {"path": str(folder)}})
        run = kill_worker_mid_run(client, kb, "many", settings, at_least_listed=100)
        assert run["status"] == "succeeded", run
        assert run["attempts"] >= 2, run  # another process took it over
        assert counts(run) == {"created": total}, run
        docs = documents(client, kb)
        assert len(docs) == total
        assert {d["content_version"] for d in docs.values()} == {1}
        assert all(d["status"] == "ready" for d in docs.values())
        again = sync(client, kb, "many")
        assert counts(again) == {"unchanged": total}

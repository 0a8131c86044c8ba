"""The `git` source through the real API and workers, against real git servers on loopback (`git
daemon` and git's smart HTTP) and a repository on disk: first sync, a change, a deletion, an
unchanged re-sync that does no work, a force-push, failures that delete nothing, and a run resumed
after its worker was killed (on the commit it started from, though the branch moved meanwhile).

Loopback is refused by the default fetch policy, so the served repositories are synced by a worker
and an API of their own whose allowlist names 127.0.0.1 (`sources_stack`, tests/e2e/conftest.py); a
repository on disk inside the folder roots is synced by the stack's own worker.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared.config import Settings
from tests.e2e.helpers import Server
from tests.e2e.own_stack import OwnStack
from tests.e2e.sources import ENDED, add, counts, documents, new_kb, sync, wait_run
from tests.fixtures.git_server import GitDaemon, SmartHttp, free_port, git_daemon, smart_http

pytestmark = pytest.mark.e2e


class Repo:
    """A repository a test writes and commits to (the servers serve it as it is)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True)
        self.git("init", "-q", "-b", "main")

    def git(self, *args: str) -> str:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.path),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@example.com",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@example.com",
        }
        done = subprocess.run(
            ["git", *args], cwd=self.path, env=env, capture_output=True, text=True, check=True, timeout=120
        )
        return done.stdout.strip()

    def commit(self, files: dict[str, str | None], message: str = "change") -> str:
        """Write (or, for None, remove) files and commit them; the new commit's id."""
        for name, text in files.items():
            if text is None:
                self.git("rm", "-q", "--", name)
                continue
            (self.path / name).parent.mkdir(parents=True, exist_ok=True)
            (self.path / name).write_text(text)
            self.git("add", "--", name)
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="module")
def daemon(served: Path) -> Iterator[GitDaemon]:
    with git_daemon(served) as running:
        yield running


@pytest.fixture(scope="module")
def http(served: Path) -> Iterator[SmartHttp]:
    with smart_http(served) as running:
        yield running


@pytest.fixture
def kb(sources_stack: OwnStack) -> Iterator[str]:
    yield from new_kb(sources_stack.server, "git")


@pytest.fixture
def stack_kb(server: Server) -> Iterator[str]:
    yield from new_kb(server, "git")


def _versions(client: httpx.Client, kb: str) -> dict[str, int]:
    return {doc_id: doc["content_version"] for doc_id, doc in documents(client, kb).items()}


def _search(client: httpx.Client, kb: str, query: str) -> dict[str, object]:
    found = client.post("/v1/search", json={"query": query, "kb_ids": [kb], "top_k": 1}).json()
    return dict(found["results"][0])


def test_a_repository_served_by_git_daemon_is_followed_commit_by_commit(
    sources_stack: OwnStack, daemon: GitDaemon, served: Path, kb: str
) -> None:
    repo = Repo(served / f"docs-{secrets.token_hex(3)}")
    first = repo.commit(
        {
            "guide/install.md": "# Install\n\nRun the installer, then feed the kingfisher.",
            "guide/usage.md": "# Usage\n\nThe pelican command sorts herrings by weight.",
            "notes.txt": "Cormorants dry their wings on the harbour wall.",
            "drafts/idea.md": "Left out by the source's exclude.",
        }
    )
    os.symlink("guide/usage.md", repo.path / "usage-link.md")  # a link is not a file of its own
    repo.git("add", "usage-link.md")
    repo.git("update-index", "--add", "--cacheinfo", f"160000,{first},vendor/module")  # a submodule
    first = repo.commit({}, "links")
    url = daemon.url(repo.path.name)
    with sources_stack.server.client("a_admin") as client:
        add(
            client,
            kb,
            {
                "type": "git",
                "source_id": "docs",
                "settings": {"url": url, "ref": "main", "exclude": ["drafts/**"]},
            },
        )
        one = sync(client, kb, "docs")
        assert one["status"] == "succeeded", one
        assert counts(one) == {"created": 3}, one
        docs = documents(client, kb)
        assert set(docs) == {"guide/install.md", "guide/usage.md", "notes.txt"}
        assert all(d["status"] == "ready" for d in docs.values()), docs
        hit = _search(client, kb, "pelican herrings")
        assert hit["doc_id"] == "guide/usage.md"
        assert hit["source_uri"] == f"{url}#guide/usage.md@{first}"
        assert client.get(f"/v1/kbs/{kb}/documents/guide/usage.md").json()["source_id"] == "docs"

        # A commit that changes a file, deletes one and adds one: only those three are touched.
        second = repo.commit(
            {
                "guide/usage.md": "# Usage\n\nThe pelican command now sorts sprats as well.",
                "notes.txt": None,
                "faq.md": "# FAQ\n\nGannets dive at sixty miles an hour.",
            }
        )
        two = sync(client, kb, "docs")
        assert counts(two) == {"updated": 1, "deleted": 1, "created": 1, "unchanged": 1}, two
        docs = documents(client, kb)
        assert set(docs) == {"guide/install.md", "guide/usage.md", "faq.md"}
        assert client.get(f"/v1/kbs/{kb}/documents/notes.txt").json()["status"] == "deleted"
        assert "sprats" in str(_search(client, kb, "pelican sprats")["text"])
        assert docs["faq.md"]["source_uri"] == f"{url}#faq.md@{second}"
        assert docs["guide/install.md"]["source_uri"] == f"{url}#guide/install.md@{first}"
        assert client.get(f"/v1/batches/{two['run_id']}").json()["total"] == 2

        # No new commit: nothing is read or submitted, no document changes.
        versions = _versions(client, kb)
        three = sync(client, kb, "docs")
        assert counts(three) == {"unchanged": 3}, three
        assert three["failures"] == []
        assert client.get(f"/v1/batches/{three['run_id']}").json()["total"] == 0
        assert _versions(client, kb) == versions

        # A force-push: history rewritten from the first commit, the synced commit gone from it.
        repo.git("reset", "-q", "--hard", first)
        repo.commit(
            {"guide/install.md": "# Install\n\nRun the installer, then feed the osprey."}, "rewritten"
        )
        four = sync(client, kb, "docs")
        assert four["status"] == "succeeded", four
        # install.md changed, usage.md is back to its first text, faq.md is gone, notes.txt is back.
        assert counts(four) == {"updated": 2, "deleted": 1, "created": 1}, four
        docs = documents(client, kb)
        assert set(docs) == {"guide/install.md", "guide/usage.md", "notes.txt"}
        assert "osprey" in str(_search(client, kb, "installer osprey")["text"])
        assert "herrings" in str(_search(client, kb, "pelican herrings")["text"])

        # A commit that removes two of the three files: the diff's deletions are held like a
        # listing's that finds too little, and nothing is deleted until a run is allowed to.
        repo.commit({"guide/install.md": None, "notes.txt": None}, "emptied")
        five = sync(client, kb, "docs")
        assert (five["status"], five["error"]["code"]) == ("failed", "CONFLICT"), five
        assert set(documents(client, kb)) == {"guide/install.md", "guide/usage.md", "notes.txt"}
        allowed = client.post(f"/v1/kbs/{kb}/sources/docs/sync", params={"allow_deletions": "true"})
        six = wait_run(client, kb, "docs", allowed.json()["run_id"])
        assert counts(six) == {"deleted": 2, "unchanged": 1}, six
        assert six["listed"] == 1
        assert set(documents(client, kb)) == {"guide/usage.md"}


def test_smart_http_and_failures_that_delete_nothing(
    sources_stack: OwnStack, http: SmartHttp, served: Path, kb: str, tmp_path: Path
) -> None:
    repo = Repo(served / f"wiki-{secrets.token_hex(3)}")
    repo.commit({"a.md": "Avocets sweep their bills through the mud.", "b.md": "Bitterns boom at dusk."})
    repo.git("branch", "topic")
    with sources_stack.server.client("a_admin") as client:
        add(client, kb, {"type": "git", "source_id": "wiki", "settings": {"url": http.url(repo.path.name)}})
        add(
            client,
            kb,
            {
                "type": "git",
                "source_id": "topic",
                "doc_id_prefix": "topic/",
                "settings": {"url": http.url(repo.path.name), "ref": "topic"},
            },
        )
        assert counts(sync(client, kb, "wiki")) == {"created": 2}
        assert counts(sync(client, kb, "topic")) == {"created": 2}
        repo.commit({"b.md": "Bitterns boom at dusk in the reeds."})
        assert counts(sync(client, kb, "wiki")) == {"updated": 1, "unchanged": 1}
        before = _versions(client, kb)

        # The branch is deleted: the run fails NOT_FOUND and its documents stay.
        repo.git("branch", "-D", "topic")
        gone_ref = sync(client, kb, "topic")
        assert (gone_ref["status"], gone_ref["error"]["code"]) == ("failed", "NOT_FOUND"), gone_ref
        # The repository moves away: INVALID_ARGUMENT, and again nothing is deleted.
        repo.path.rename(repo.path.with_name(repo.path.name + "-moved"))
        moved = sync(client, kb, "wiki")
        assert (moved["status"], moved["error"]["code"]) == ("failed", "INVALID_ARGUMENT"), moved
        assert _versions(client, kb) == before

        # A server that stopped answering: UNAVAILABLE, nothing deleted.
        other = Repo(tmp_path / "served" / "gull")
        other.commit({"gull.md": "Herring gulls steal chips on the promenade."})
        with smart_http(tmp_path / "served") as stopping:
            add(client, kb, {"type": "git", "source_id": "gull", "settings": {"url": stopping.url("gull")}})
            assert counts(sync(client, kb, "gull")) == {"created": 1}
        down = sync(client, kb, "gull")
        assert (down["status"], down["error"]["code"]) == ("failed", "UNAVAILABLE"), down
        assert "gull.md" in documents(client, kb)

        # A redirect is not followed: the URL it leads to is the one to give.
        add(client, kb, {"type": "git", "source_id": "moved", "settings": {"url": http.url("moved/x")}})
        redirected = sync(client, kb, "moved")
        assert (redirected["status"], redirected["error"]["code"]) == ("failed", "FETCH_REFUSED"), redirected
        assert "/x/info/refs?service=git-upload-pack" not in http.requests


def test_a_repository_on_disk_is_synced_by_the_stacks_worker(
    server: Server, settings: Settings, stack_kb: str
) -> None:
    roots = settings.sources.folder_roots
    assert roots, "RAGLINE_SOURCES__FOLDER_ROOTS is not set: run the tests with deploy/local/test.sh"
    repo = Repo(Path(str(roots[0]).replace("{tenant}", "")) / f"git-{secrets.token_hex(4)}")
    try:
        head = repo.commit(
            {
                "plovers.md": "Ringed plovers run and stop on the shingle.",
                "terns.md": "Little terns hover before they dive.",
            }
        )
        with server.client("a_admin") as client:
            add(client, stack_kb, {"type": "git", "source_id": "shore", "settings": {"url": str(repo.path)}})
            first = sync(client, stack_kb, "shore")
            assert counts(first) == {"created": 2}, first
            docs = documents(client, stack_kb)
            assert docs["terns.md"]["source_uri"] == f"{repo.path.as_uri()}#terns.md@{head}"
            assert all(d["status"] == "ready" for d in docs.values()), docs

            again = sync(client, stack_kb, "shore")
            assert counts(again) == {"unchanged": 2}, again
            assert client.get(f"/v1/batches/{again['run_id']}").json()["total"] == 0

            # A document deleted by hand comes back on the next sync, as a folder's does, though no
            # commit names its file (it stayed deleted, counted unchanged).
            assert client.delete(f"/v1/kbs/{stack_kb}/documents/terns.md").status_code in (200, 202, 204)
            deadline = time.monotonic() + 60
            while client.get(f"/v1/kbs/{stack_kb}/documents/terns.md").json()["status"] != "deleted":
                assert time.monotonic() < deadline, "the document was not deleted"
                time.sleep(0.3)
            back = sync(client, stack_kb, "shore")
            assert counts(back) == {"created": 1, "unchanged": 1}, back
            assert set(documents(client, stack_kb)) == {"plovers.md", "terns.md"}

            repo.commit({"terns.md": None, "plovers.md": "Ringed plovers feign a broken wing."})
            assert counts(sync(client, stack_kb, "shore")) == {"deleted": 1, "updated": 1}
            assert set(documents(client, stack_kb)) == {"plovers.md"}
    finally:
        shutil.rmtree(repo.path, ignore_errors=True)


def test_a_run_whose_worker_is_killed_is_resumed_on_the_commit_it_started_from(
    sources_stack: OwnStack, daemon: GitDaemon, served: Path, kb: str
) -> None:
    repo = Repo(served / f"notes-{secrets.token_hex(3)}")
    total = 500
    started_on = repo.commit(
        {
            f"part-{n // 100}/note-{n:04d}.txt": f"Field note {n}: a heron stood in reed bed {n}."
            for n in range(total)
        }
    )
    last = "part-4/note-0499.txt"
    with sources_stack.server.client("a_admin") as client:
        add(
            client, kb, {"type": "git", "source_id": "notes", "settings": {"url": daemon.url(repo.path.name)}}
        )
        started = client.post(f"/v1/kbs/{kb}/sources/notes/sync").json()
        deadline = time.monotonic() + 300
        while True:
            run = client.get(f"/v1/kbs/{kb}/sources/notes/runs/{started['run_id']}").json()
            assert run["status"] not in ENDED, f"ended before the kill: {run}"
            if run["listed"] >= 100:
                break
            assert time.monotonic() < deadline, run
            time.sleep(0.05)
        sources_stack.kill_worker()
        # The branch moves on while no worker runs: the resumed run still ends on its own commit.
        moved_on = repo.commit({last: "Field note 499 was rewritten: a bittern boomed."})
        sources_stack.start_worker()
        run = wait_run(client, kb, "notes", started["run_id"])
        assert run["status"] == "succeeded", run
        assert run["attempts"] >= 2, run
        assert counts(run) == {"created": total}, run
        docs = documents(client, kb)
        assert len(docs) == total
        assert {d["content_version"] for d in docs.values()} == {1}
        assert all(d["status"] == "ready" for d in docs.values())
        assert docs[last]["source_uri"] == f"{daemon.url(repo.path.name)}#{last}@{started_on}"

        after = sync(client, kb, "notes")
        assert counts(after) == {"updated": 1, "unchanged": total - 1}, after
        assert documents(client, kb)[last]["source_uri"].endswith(f"@{moved_on}")
        assert counts(sync(client, kb, "notes")) == {"unchanged": total}


@pytest.mark.parametrize(
    ("url", "status", "code"),
    [
        ("git://127.0.0.1:9418/x", 422, "FETCH_REFUSED"),  # loopback: not without an allowlist
        ("http://169.254.169.254/x.git", 422, "FETCH_REFUSED"),
        ("ssh://git@example.com/x.git", 422, "INVALID_ARGUMENT"),
        ("ext::sh -c id", 422, "INVALID_ARGUMENT"),
        ("-uhttp://example.com/x", 422, "INVALID_ARGUMENT"),
        ("/etc", 403, "FORBIDDEN"),
    ],
)
def test_a_repository_the_workers_may_not_reach_is_refused_when_added(
    server: Server, stack_kb: str, url: str, status: int, code: str
) -> None:
    with server.client("a_admin") as client:
        refused = client.post(f"/v1/kbs/{stack_kb}/sources", json={"type": "git", "settings": {"url": url}})
        assert (refused.status_code, refused.json()["code"]) == (status, code), refused.text
        bad_ref = client.post(
            f"/v1/kbs/{stack_kb}/sources",
            json={"type": "git", "settings": {"url": "https://example.com/x.git", "ref": "--upload-pack"}},
        )
        assert bad_ref.status_code == 422, bad_ref.text


def test_nothing_listens_there(sources_stack: OwnStack, kb: str) -> None:
    with sources_stack.server.client("a_admin") as client:
        url = f"git://127.0.0.1:{free_port()}/x"
        add(client, kb, {"type": "git", "source_id": "nobody", "settings": {"url": url}})
        run = sync(client, kb, "nobody")
        assert (run["status"], run["error"]["code"]) == ("failed", "UNAVAILABLE"), run

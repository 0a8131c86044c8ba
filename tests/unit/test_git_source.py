"""The `git` connector without the stack: git's outputs parsed, the modes taken, links back, error
codes, the policy and the roots applied to a repository, and listings of real repositories on disk
(a path repository: the connector fetches it with git itself, as a worker does)."""

from __future__ import annotations

import ipaddress
import os
import subprocess
from pathlib import Path

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.fetch.policy import FetchPolicy, IPAddress
from shared.sources.models import GitSettings, ItemOutcome, ItemState
from workers.sources.connector import Found, Gone
from workers.sources.git import (
    GitConnector,
    Resolver,
    cache_dir,
    git_error,
    item_uri,
    parse_raw_diff,
    parse_tree,
    regular,
    remote_for,
)

MAX_BYTES = 1000


def git(repo: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(repo),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    done = subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str | None], message: str = "change") -> str:
    """Write (or, for None, remove) files and commit them; the new commit's id."""
    for name, text in files.items():
        path = repo / name
        if text is None:
            git(repo, "rm", "-q", "--", name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git(repo, "add", "--", name)
    git(repo, "commit", "-q", "--allow-empty", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def roots(tmp_path: Path) -> list[Path]:
    root = tmp_path / "roots"
    root.mkdir()
    return [root]


@pytest.fixture
def repo(roots: list[Path]) -> Path:
    path = roots[0] / "repo"
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    return path


def connector(
    repo: Path, roots: list[Path], tmp_path: Path, cursor: dict[str, str] | None = None, **settings: object
) -> GitConnector:
    return GitConnector(
        GitSettings.model_validate({"url": str(repo), **settings}),
        cursor or {},
        cache_dir(tmp_path / "state", "t", "kb", "src", str(repo)),
        roots,
        FetchPolicy(),
        MAX_BYTES,
        60,
    )


def listing(
    source: GitConnector,
    known: dict[str, ItemState] | None = None,
    run_id: str = "r",
    again: frozenset[str] = frozenset(),
) -> dict[str, Found | Gone]:
    return {entry.key: entry for entry in source.scan(known or {}, run_id, again)}


def states(entries: dict[str, Found | Gone], run_id: str) -> dict[str, ItemState]:
    """What the engine would remember after taking a listing (every item taken)."""
    return {
        key: ItemState(
            key=key,
            doc_id=key,
            version=entry.version if isinstance(entry, Found) else None,
            run_id=run_id,
            outcome=ItemOutcome.CREATED if isinstance(entry, Found) else ItemOutcome.DELETED,
            extra=entry.extra if isinstance(entry, Found) else {},
        )
        for key, entry in entries.items()
    }


# git's outputs


def test_tree_and_diff_records_are_parsed_with_odd_paths_links_and_submodules(repo: Path) -> None:
    odd = "notes/tab\there\nnewline ü.md"
    first = commit(repo, {"a.md": "alpha", odd: "odd", "run.sh": "echo"})
    git(repo, "update-index", "--chmod=+x", "run.sh")
    os.symlink("a.md", repo / "link.md")
    git(repo, "add", "link.md")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{first},vendor/lib")
    second = commit(repo, {"a.md": None, "b.md": "beta"})

    tree = {
        f.path: f
        for f in parse_tree(
            subprocess.check_output(["git", "-C", str(repo), "ls-tree", "-r", "-z", "-l", second])
        )
    }
    assert set(tree) == {odd, "run.sh", "link.md", "vendor/lib", "b.md"}
    assert (tree[odd].mode, tree[odd].size) == ("100644", 3)
    assert tree["run.sh"].mode == "100755"
    assert tree["link.md"].mode == "120000"
    assert (tree["vendor/lib"].mode, tree["vendor/lib"].size) == ("160000", None)
    assert tree["b.md"].blob == git(repo, "rev-parse", f"{second}:b.md")
    assert {p for p, f in tree.items() if regular(f.mode)} == {odd, "run.sh", "b.md"}

    raw = subprocess.check_output(
        [
            "git",
            "-C",
            str(repo),
            "diff-tree",
            "-r",
            "-z",
            "--raw",
            "--no-renames",
            "--no-commit-id",
            first,
            second,
        ]
    )
    changes = {c.path: c for c in parse_raw_diff(raw)}
    assert {p: c.status for p, c in changes.items()} == {
        "a.md": "D", "b.md": "A", "run.sh": "M", "link.md": "A", "vendor/lib": "A",
    }  # fmt: skip
    assert changes["b.md"].new_blob == tree["b.md"].blob
    assert changes["vendor/lib"].new_mode == "160000"
    assert parse_raw_diff(b"") == []


def test_links_back_name_the_commit_the_content_came_from() -> None:
    commit_id = "a" * 40
    assert item_uri("https://github.com/acme/docs.git", commit_id, "guide/a b.md") == (
        f"https://github.com/acme/docs/blob/{commit_id}/guide/a%20b.md"
    )
    assert item_uri("https://gitlab.com/group/sub/proj", commit_id, "x.md") == (
        f"https://gitlab.com/group/sub/proj/-/blob/{commit_id}/x.md"
    )
    assert item_uri("git://127.0.0.1:9418/docs", commit_id, "x#1.md") == (
        f"git://127.0.0.1:9418/docs#x%231.md@{commit_id}"
    )
    assert item_uri("file:///srv/repo", commit_id, "x.md") == f"file:///srv/repo#x.md@{commit_id}"


@pytest.mark.parametrize(
    ("stderr", "code"),
    [
        ("fatal: couldn't find remote ref nosuch\n", ErrorCode.NOT_FOUND),
        ("fatal: remote error: access denied or repository not exported: /x\n", ErrorCode.INVALID_ARGUMENT),
        ("fatal: '/srv/x' does not appear to be a git repository\n", ErrorCode.INVALID_ARGUMENT),
        ("fatal: repository 'http://h/x/' not found\n", ErrorCode.INVALID_ARGUMENT),
        (
            "fatal: unable to connect to 127.0.0.1:\n127.0.0.1[0: 127.0.0.1]: errno=Connection refused\n",
            ErrorCode.UNAVAILABLE,
        ),
        ("fatal: unable to access 'http://h/x/': Failed to connect to h port 80\n", ErrorCode.UNAVAILABLE),
        ("fatal: could not read Username for 'https://h': terminal prompts disabled\n", ErrorCode.FORBIDDEN),
        ("fatal: transport 'file' not allowed\n", ErrorCode.FETCH_REFUSED),
        ("fatal: remote error: no such repository: /nosuch\n", ErrorCode.INVALID_ARGUMENT),
        (
            "fatal: unable to access 'http://h/m/': The requested URL returned error: 302\n",
            ErrorCode.FETCH_REFUSED,
        ),
    ],
)
def test_fetch_failures_get_stable_codes(stderr: str, code: ErrorCode) -> None:
    error = git_error(stderr, "'main'")
    assert error.code == code
    assert "git: fatal:" in error.message


# the policy and the roots


def fixed(*addresses: str) -> Resolver:
    def resolver(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in addresses]

    return resolver


def test_a_url_reaches_only_what_the_policy_allows_and_git_is_pinned_to_it(roots: list[Path]) -> None:
    closed, loopback = FetchPolicy(), FetchPolicy.of(["127.0.0.1", "::1"])
    for url in ("git://127.0.0.1/r", "http://127.0.0.1:8080/r.git", "https://internal.example/r"):
        with pytest.raises(RaglineError) as refused:
            remote_for(url, roots, closed, fixed("127.0.0.1"))
        assert refused.value.code == ErrorCode.FETCH_REFUSED
    with pytest.raises(RaglineError) as metadata:
        remote_for("http://169.254.169.254/r", roots, FetchPolicy.of(["169.254.0.0/16"]), fixed())
    assert metadata.value.code == ErrorCode.FETCH_REFUSED

    daemon = remote_for(
        "git://repos.internal:9419/docs.git", roots, FetchPolicy.of(["repos.internal"]), fixed("10.1.2.3")
    )
    assert (daemon.fetch_from, daemon.protocol, daemon.pins) == ("git://10.1.2.3:9419/docs.git", "git", ())
    assert daemon.shown == "git://repos.internal:9419/docs.git"
    six = remote_for("git://[::1]/docs", roots, loopback, fixed())
    assert six.fetch_from == "git://[::1]:9418/docs"
    http = remote_for(
        "https://git.internal/docs.git", roots, FetchPolicy.of(["git.internal"]), fixed("10.9.9.9")
    )
    assert (http.fetch_from, http.protocol) == ("https://git.internal/docs.git", "https")
    assert http.pins == ("http.curloptResolve=git.internal:443:10.9.9.9",)


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("--upload-pack=touch /tmp/x", ErrorCode.INVALID_ARGUMENT),
        ("ext::sh -c touch% /tmp/x", ErrorCode.INVALID_ARGUMENT),  # no "://": a path, and not absolute
        ("ssh://git@host/r.git", ErrorCode.INVALID_ARGUMENT),
        ("http://user:pw@host/r.git", ErrorCode.INVALID_ARGUMENT),
        ("/etc", ErrorCode.FORBIDDEN),
    ],
)
def test_what_is_not_a_reachable_repository_is_refused(roots: list[Path], url: str, code: ErrorCode) -> None:
    with pytest.raises(RaglineError) as refused:
        remote_for(url, roots, FetchPolicy(), fixed("93.184.216.34"))
    assert refused.value.code == code


def test_a_repository_in_the_roots_may_not_borrow_from_outside_them(
    roots: list[Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    git(outside, "init", "-q", "--bare")
    pointing = roots[0] / "worktree"
    pointing.mkdir()
    (pointing / ".git").write_text(f"gitdir: {outside}\n")
    borrowing = roots[0] / "borrowing"
    borrowing.mkdir()
    git(borrowing, "init", "-q", "--bare")
    (borrowing / "objects" / "info" / "alternates").write_text(f"{outside / 'objects'}\n")
    linking = roots[0] / "linking"
    linking.mkdir()
    git(linking, "init", "-q", "--bare")
    subprocess.run(["rm", "-rf", str(linking / "objects")], check=True)
    (linking / "objects").symlink_to(outside / "objects")
    # Packs and refs linked from another root (a repository of another tenant's root), and an empty
    # directory beside a link named like it plus ".git", which git reads when the path is none.
    other = tmp_path / "other"
    other.mkdir()
    git(other, "init", "-q", "-b", "main")
    commit(other, {"secret.txt": "another root's file"})
    git(other, "gc", "-q")
    packs = roots[0] / "packs"
    (packs / ".git" / "objects" / "info").mkdir(parents=True)
    (packs / ".git" / "refs" / "heads").mkdir(parents=True)
    (packs / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (packs / ".git" / "objects" / "pack").symlink_to(other / ".git" / "objects" / "pack")
    (packs / ".git" / "packed-refs").symlink_to(other / ".git" / "packed-refs")
    beside = roots[0] / "beside"
    beside.mkdir()
    (roots[0] / "beside.git").symlink_to(other / ".git")
    for path in (pointing, borrowing, linking, packs, beside):
        with pytest.raises(RaglineError) as refused:
            remote_for(str(path), roots, FetchPolicy(), fixed())
        assert refused.value.code == ErrorCode.FORBIDDEN
    plain = roots[0] / "plain"
    plain.mkdir()
    git(plain, "init", "-q", "-b", "main")
    inside = remote_for(str(plain), roots, FetchPolicy(), fixed())
    assert inside.protocol == "file"
    assert inside.fetch_from == str(plain / ".git")


# listings of real repositories


def test_first_listing_takes_the_regular_files_then_a_diff_names_only_changes(
    repo: Path, roots: list[Path], tmp_path: Path
) -> None:
    first = commit(
        repo, {"docs/a.md": "alpha", "docs/b.md": "beta", "big.txt": "x" * (MAX_BYTES + 1), "skip/c.md": "c"}
    )
    os.symlink("docs/a.md", repo / "link.md")
    git(repo, "add", "link.md")
    git(repo, "update-index", "--add", "--cacheinfo", f"160000,{first},vendor/lib")
    first = commit(repo, {}, "links")

    source = connector(repo, roots, tmp_path, exclude=["skip/**"])
    entries = listing(source, run_id="r1")
    assert not source.incremental
    assert set(entries) == {"docs/a.md", "docs/b.md", "big.txt"}
    a = entries["docs/a.md"]
    assert isinstance(a, Found)
    assert (a.version, a.doc_id, a.filename) == (
        git(repo, "rev-parse", f"{first}:docs/a.md"),
        "docs/a.md",
        "a.md",
    )
    assert a.uri == f"{repo.as_uri()}#docs/a.md@{first}"
    assert source.read(a) == b"alpha"
    big = entries["big.txt"]
    assert isinstance(big, Found)
    assert big.error is not None
    assert big.error.code == ErrorCode.TOO_LARGE
    assert source.cursor() == {"commit": first, "ref": "HEAD"}

    commit(repo, {"docs/a.md": "alpha two", "docs/b.md": None, "docs/new.md": "new", "skip/c.md": "c2"})
    (repo / "docs" / "new.md").unlink()
    os.symlink("a.md", repo / "docs" / "new.md")  # a file that becomes a link is gone as a file
    git(repo, "add", "docs/new.md")
    third = commit(repo, {"docs/d.md": "delta"})
    known = states(entries, "r1")
    known["big.txt"] = known["big.txt"].model_copy(update={"outcome": ItemOutcome.FAILED, "version": None})
    later = connector(repo, roots, tmp_path, cursor=source.cursor(), exclude=["skip/**"])
    changed = listing(later, known, "r2", again=frozenset({"big.txt"}))  # the engine asks for it
    assert later.incremental
    assert {k: type(e).__name__ for k, e in changed.items()} == {
        "docs/a.md": "Found",
        "docs/b.md": "Gone",
        "docs/d.md": "Found",
        "big.txt": "Found",  # failed before: listed again
    }  # fmt: skip  (docs/new.md was added as a link: not a file, nothing to delete)
    assert changed["docs/a.md"].version == git(repo, "rev-parse", f"{third}:docs/a.md")  # type: ignore[union-attr]
    assert later.cursor() == {"commit": third, "ref": "HEAD"}

    # Nothing new: an empty diff.
    again = connector(repo, roots, tmp_path, cursor=later.cursor(), exclude=["skip/**"])
    assert listing(again, {}, "r3") == {}
    assert again.incremental


def test_a_force_push_is_diffed_tree_to_tree_and_a_lost_cache_lists_everything(
    repo: Path, roots: list[Path], tmp_path: Path
) -> None:
    base = commit(repo, {"a.md": "a", "b.md": "b"})
    commit(repo, {"c.md": "c"})
    source = connector(repo, roots, tmp_path)
    listing(source)
    git(repo, "reset", "-q", "--hard", base)  # history rewritten: the synced commit is no ancestor
    rewritten = commit(repo, {"b.md": "b rewritten", "e.md": "e"}, "rewritten")
    after = connector(repo, roots, tmp_path, cursor=source.cursor())
    changed = listing(after, run_id="r2")
    assert after.incremental
    assert {k: type(e).__name__ for k, e in changed.items()} == {
        "b.md": "Found",
        "c.md": "Gone",
        "e.md": "Found",
    }

    cache = cache_dir(tmp_path / "state", "t", "kb", "src", str(repo))
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    newest = commit(repo, {"f.md": "f"})
    fresh = connector(repo, roots, tmp_path, cursor=after.cursor())
    assert set(listing(fresh)) == {"a.md", "b.md", "e.md", "f.md"}  # the synced commit is not there
    assert not fresh.incremental
    assert (after.cursor()["commit"], fresh.cursor()["commit"]) == (rewritten, newest)


def test_a_resumed_run_ends_on_the_commit_it_started_from(
    repo: Path, roots: list[Path], tmp_path: Path
) -> None:
    started = commit(repo, {"a.md": "a", "b.md": "b"})
    first = connector(repo, roots, tmp_path)
    taken = states({"a.md": next(iter(listing(first, run_id="r1").values()))}, "r1")  # died after one item
    commit(repo, {"b.md": "b moved on"})
    resumed = connector(repo, roots, tmp_path)
    entries = listing(resumed, taken, "r1")
    assert resumed.cursor()["commit"] == started
    assert entries["b.md"].version == git(repo, "rev-parse", f"{started}:b.md")  # type: ignore[union-attr]


def test_a_stale_lock_left_by_a_killed_git_does_not_stop_the_next_run(
    repo: Path, roots: list[Path], tmp_path: Path
) -> None:
    commit(repo, {"a.md": "a"})
    source = connector(repo, roots, tmp_path)
    listing(source)
    cache = cache_dir(tmp_path / "state", "t", "kb", "src", str(repo))
    (cache / "refs" / "ragline" / "head.lock").write_text("")
    (cache / "shallow.lock").write_text("")
    newer = commit(repo, {"b.md": "b"})
    after = connector(repo, roots, tmp_path, cursor=source.cursor())
    assert set(listing(after, run_id="r2")) == {"b.md"}
    assert after.cursor()["commit"] == newer


@pytest.mark.parametrize(
    ("ref", "code"),
    [("nosuch", ErrorCode.NOT_FOUND), ("main", None)],
)
def test_an_unknown_ref_fails_and_a_known_one_lists(
    repo: Path, roots: list[Path], tmp_path: Path, ref: str, code: ErrorCode | None
) -> None:
    commit(repo, {"a.md": "a"})
    source = connector(repo, roots, tmp_path, ref=ref)
    if code is None:
        assert set(listing(source)) == {"a.md"}
        return
    with pytest.raises(RaglineError) as failed:
        listing(source)
    assert failed.value.code == code


def test_a_directory_that_is_no_repository_is_invalid(roots: list[Path], tmp_path: Path) -> None:
    plain = roots[0] / "plain"
    plain.mkdir()
    with pytest.raises(RaglineError) as failed:
        listing(connector(plain, roots, tmp_path))
    assert failed.value.code == ErrorCode.INVALID_ARGUMENT

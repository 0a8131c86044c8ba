"""The `git` source: a repository at a ref (branch, tag or commit), kept in sync by commit diff.

The repository is an http(s):// or git:// URL, or a path inside the folder roots. Each source has
a bare cache repository of its own under `<state_dir>/sources-cache/git/`, into which a run
fetches only the ref's tip (`--depth=1`): the documents are the tip's files, and the history
behind it is never needed. Items are the tip's regular files (links and submodules are not
files), their version the blob id, so a file is read only when its content changed.

The first run, and any run whose cache lacks the commit last synced (a new host, a removed cache),
lists the whole tree. Later runs diff the tree last synced against the new one and name only what
was added, changed or deleted (`incremental`): the knowledge base holds the tree last synced, so
the tree diff is exact whatever happened to the history in between, a force-push included. Items
that failed before are offered again, as the full listing would.

Git reaches only what the fetch policy lets the workers reach: the host is resolved and checked
here, and git is pinned to the address checked (curl's resolve list for http(s), the address
itself for git://), follows no redirect, reads no user or system configuration (an `insteadOf`
there could send it elsewhere), asks for no credentials, and may use the one protocol of the URL.
A path must lie inside the folder roots, its git directory and object stores too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from shared.errors import ErrorCode, PermanentError, RaglineError, TransientError
from shared.fetch.client import resolve
from shared.fetch.policy import FetchPolicy, IPAddress, check_url
from shared.models import safe_doc_id
from shared.sources.models import GitSettings, ItemOutcome, ItemState
from workers.sources.connector import Connector, Found, Gone, selected
from workers.sources.folder import inside_roots

Resolver = Callable[[str, int], list[IPAddress]]

HEAD_REF = "refs/ragline/head"  # the ref's tip as last fetched
RUN_REF = "refs/ragline/run"  # the commit the current run lists, kept from gc until the next run
SYNCED_REF = "refs/ragline/synced"  # the commit the last listing ended on: the next diff's base
_DONE_OUTCOMES = (ItemOutcome.CREATED, ItemOutcome.UPDATED, ItemOutcome.UNCHANGED)
_STDERR_SHOWN = 300
# Only what git needs from the worker's environment: a proxy or CA bundle an operator set for it.
_PASSED_ENV = (
    "PATH", "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "GIT_SSL_CAINFO", "GIT_SSL_CAPATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip
# Settings of every git command: hooks, credentials and background work are off.
_CONFIG = (
    "core.hooksPath=/dev/null",
    "credential.helper=",
    "core.askPass=",
    "gc.autoDetach=false",  # an automatic gc runs within the command's time limit, not after it
    "http.followRedirects=false",  # a redirect would reach an address nobody checked
    "http.lowSpeedLimit=1000",
    "http.lowSpeedTime=60",
    "protocol.version=2",
)


# Pure parts: git's outputs, modes, links back


def regular(mode: str) -> bool:
    """A regular file's mode (100644, 100755, and 100664 of old repositories); not a link
    (120000), a submodule (160000) or a tree (040000)."""
    return mode.startswith("100")


@dataclass(frozen=True)
class TreeFile:
    """One entry of `git ls-tree -r -z -l`."""

    path: str
    mode: str
    blob: str
    size: int | None  # None where git gives none (a submodule)


@dataclass(frozen=True)
class Change:
    """One entry of `git diff-tree -r -z --raw --no-renames`."""

    status: str  # A added, M modified, D deleted, T type changed (file to link and back)
    path: str
    new_mode: str
    new_blob: str


def _path(raw: bytes) -> str:
    # Paths are bytes in git; one that is not UTF-8 still gets a key (the blob id reads it).
    return raw.decode("utf-8", "replace")


def parse_tree(output: bytes) -> list[TreeFile]:
    """`<mode> <type> <object> <size>\\t<path>` records, NUL-terminated."""
    files: list[TreeFile] = []
    for record in output.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, _kind, blob, size = meta.decode("ascii").split()
        files.append(TreeFile(_path(path), mode, blob, int(size) if size.isdigit() else None))
    return files


def parse_raw_diff(output: bytes) -> list[Change]:
    """`:<old mode> <new mode> <old object> <new object> <status>` NUL `<path>` NUL, repeated."""
    fields = output.split(b"\0")
    changes: list[Change] = []
    at = 0
    while at + 1 < len(fields) and fields[at]:
        meta = fields[at].decode("ascii")
        if not meta.startswith(":"):
            raise ValueError(f"not a raw diff record: {meta[:80]!r}")
        _old_mode, new_mode, _old_blob, new_blob, status = meta[1:].split()
        changes.append(Change(status[0], _path(fields[at + 1]), new_mode, new_blob))
        at += 2
    return changes


_BROWSE = {
    "github.com": "{base}/blob/{commit}/{path}",
    "gitlab.com": "{base}/-/blob/{commit}/{path}",
    "codeberg.org": "{base}/src/commit/{commit}/{path}",
    "bitbucket.org": "{base}/src/{commit}/{path}",
}


def item_uri(repository: str, commit: str, path: str) -> str:
    """Where a user reads the file as indexed: a browse link on the hosts whose layout is known,
    else `<repository>#<path>@<commit>`. The commit is the one the content was taken from, so the
    link shows what was indexed even after the branch moved on."""
    quoted = quote(path, safe="/")
    parts = urlsplit(repository)
    template = _BROWSE.get(parts.hostname or "") if parts.scheme in ("http", "https") else None
    if template is not None:
        base = f"https://{parts.hostname}{parts.path.rstrip('/').removesuffix('.git')}"
        return template.format(base=base, commit=commit, path=quoted)
    return f"{repository}#{quoted}@{commit}"


def git_error(stderr: str, what: str) -> RaglineError:
    """What a failed `git fetch` means to a user, from its message (git runs with LC_ALL=C)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = next((line for line in lines if line.startswith("fatal:")), lines[-1] if lines else "")
    said = f" (git: {fatal[:_STDERR_SHOWN]})" if fatal else ""
    text = stderr.lower()

    def has(*needles: str) -> bool:
        return any(needle in text for needle in needles)

    if has("couldn't find remote ref", "no such ref", "not our ref", "unknown revision", "invalid refspec"):
        return PermanentError(f"the ref {what} is not in the repository{said}", code=ErrorCode.NOT_FOUND)
    if has("terminal prompts disabled", "authentication failed", "could not read username", "error: 401"):
        return PermanentError(
            f"the repository asks for credentials, which git sources do not give{said}",
            code=ErrorCode.FORBIDDEN,
        )
    if has("dubious ownership"):
        return PermanentError(
            f"git refuses a repository owned by another user{said}", code=ErrorCode.FORBIDDEN
        )
    if has("returned error: 30"):
        return PermanentError(
            f"the repository's URL redirects, and git sources follow no redirect: give the URL it "
            f"redirects to{said}",
            code=ErrorCode.FETCH_REFUSED,
        )
    if has("not allowed"):
        return PermanentError(f"git may not use this transport{said}", code=ErrorCode.FETCH_REFUSED)
    if has(
        "does not appear to be a git repository",
        "not exported",
        "no such repository",
        "repository not found",
        "not found",
        "not a git repository",
        "error: 403",
        "error: 404",
        "not valid: is this a git repository",
    ):
        return PermanentError(
            f"the URL or path is not a git repository that can be read{said}",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    return TransientError(f"the repository could not be reached{said}", code=ErrorCode.UNAVAILABLE)


# Reaching the repository


@dataclass(frozen=True)
class Remote:
    """What git is given: the URL or path it fetches, the protocol it may use, settings that pin
    it to the address the policy checked, and the repository as a user names it."""

    fetch_from: str
    protocol: str  # http, https, git or file
    pins: tuple[str, ...]
    shown: str


def _bracketed(address: IPAddress) -> str:
    return f"[{address}]" if address.version == 6 else str(address)


def remote_for(url: str, roots: list[Path], policy: FetchPolicy, resolver: Resolver) -> Remote:
    """Check the repository against the policy (a URL) or the roots (a path), and resolve it."""
    if url.startswith("-"):
        raise PermanentError("a repository URL may not start with '-'", code=ErrorCode.INVALID_ARGUMENT)
    if url.startswith(("http://", "https://", "git://")):
        scheme = url.split("://", 1)[0]
        target = check_url(url if scheme != "git" else "http://" + url.removeprefix("git://"))
        policy.check_name(target)
        port = target.port if scheme != "git" else (urlsplit(url).port or 9418)
        addresses = [target.literal] if target.literal is not None else resolver(target.host, port)
        policy.check_addresses(target.host, addresses)
        address = addresses[0]
        if scheme == "git":
            netloc = f"{_bracketed(address)}:{port}"
            return Remote(f"git://{netloc}{urlsplit(url).path}", "git", (), url)
        pin = f"http.curloptResolve={target.host}:{port}:{_bracketed(address)}"
        return Remote(url, scheme, (pin,), url)
    if "://" in url:
        raise PermanentError(
            "a git source is an http(s):// or git:// URL, or a path", code=ErrorCode.INVALID_ARGUMENT
        )
    if not Path(url).is_absolute():  # a relative path would be read from the worker's directory
        raise PermanentError(
            "a git source's path is absolute (or give an http(s):// or git:// URL)",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    directory = inside_roots(url, roots)
    # git is given the git directory checked, not the path: it would look further (`<path>.git`)
    # where the path is no repository.
    git_dir = _check_git_dir(directory, roots)
    return Remote(str(git_dir), "file", (), directory.as_uri())


def _check_git_dir(directory: Path, roots: list[Path]) -> Path:
    """The repository's git directory, once it, every object store it borrows from and every link in
    them are found to lie inside the roots: a `.git` file, `commondir`, `alternates` or a linked
    pack or ref could otherwise read a repository elsewhere."""
    resolved_roots = [root.resolve() for root in roots]

    def inside(path: Path) -> bool:
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return True  # nothing there: git finds nothing either
        return any(real.is_relative_to(root) for root in resolved_roots)

    dot_git = directory / ".git"
    git_dir = dot_git if dot_git.exists() else directory
    if dot_git.is_file():
        pointed = dot_git.read_text(errors="replace").strip().removeprefix("gitdir:").strip()
        git_dir = (directory / pointed).resolve()
    git_dirs = [git_dir]
    common = git_dir / "commondir"
    if common.is_file():
        git_dirs.append(git_dir / common.read_text(errors="replace").strip())
    linked = [*git_dirs, *(d / "objects" for d in git_dirs)]  # `objects` may be a link elsewhere
    for base in git_dirs:
        alternates = base / "objects" / "info" / "alternates"
        if alternates.is_file():
            for line in alternates.read_text(errors="replace").splitlines():
                if line.strip() and not line.startswith("#"):
                    linked.append(base / "objects" / line.strip())
    # Any link in a git directory (objects/pack, packed-refs, refs/...) is read by git as its own:
    # a repository of one tenant's root linking to another's packs and refs lists its files.
    for base in git_dirs:
        for where, subdirs, files in os.walk(base, followlinks=False):
            linked += [Path(where, n) for n in (*subdirs, *files) if Path(where, n).is_symlink()]
    # Where the git directory is not one to git (a HEAD it does not read), git tries `<dir>.git`
    # (`<dir>/.git`, which it tries first, is inside the walk above).
    beside = git_dir.with_name(git_dir.name + ".git")
    if os.path.lexists(beside) or not all(inside(path) for path in linked):
        raise PermanentError(
            "the repository's git directory or object store is not inside RAGLINE_SOURCES__FOLDER_ROOTS"
            f" (or '{beside.name}' lies beside it, which git could read instead)",
            code=ErrorCode.FORBIDDEN,
        )
    if not os.path.lexists(git_dir / "HEAD"):
        raise PermanentError(
            "the path is not a git repository (no HEAD in it or in its .git)", code=ErrorCode.INVALID_ARGUMENT
        )
    return git_dir


def cache_dir(state_dir: Path, tenant_id: str, kb_id: str, source_id: str, url: str) -> Path:
    """The source's own cache: a source re-added with the same id but another URL starts afresh."""
    digest = hashlib.sha256(f"{tenant_id}/{kb_id}/{source_id}\n{url}".encode()).hexdigest()[:32]
    return state_dir / "sources-cache" / "git" / digest


# The connector


class GitConnector(Connector):
    def __init__(
        self,
        settings: GitSettings,
        cursor: Mapping[str, Any],
        cache: Path,
        roots: list[Path],
        policy: FetchPolicy,
        max_bytes: int,
        timeout_s: float,
        resolver: Resolver = resolve,
    ) -> None:
        if settings.url.startswith("-") or settings.ref.startswith("-"):
            raise PermanentError("a URL or ref may not start with '-'", code=ErrorCode.INVALID_ARGUMENT)
        self.settings = settings
        self.last = cursor if cursor.get("ref") == settings.ref else {}
        self.cache = cache
        self.roots = roots
        self.policy = policy
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.resolver = resolver
        self._next: dict[str, Any] = {}

    # the engine's side

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        remote = remote_for(self.settings.url, self.roots, self.policy, self.resolver)
        self._prepare()
        commit = self._pinned(known, run_id) or self._fetch(remote)
        self._git("update-ref", RUN_REF, commit)
        base = self._base(commit)
        self.incremental = base is not None
        extra = {"commit": commit}
        if base is None:
            yield from self._everything(commit, remote, extra)
        else:
            yield from self._changes(base, commit, remote, again, extra)
        self._git("update-ref", SYNCED_REF, commit)
        self._next = {"commit": commit, "ref": self.settings.ref}

    def read(self, item: Found) -> bytes:
        assert item.version is not None
        data = self._git("cat-file", "blob", item.version)
        if len(data) > self.max_bytes:
            raise RaglineError(
                f"the file exceeds the limit of {self.max_bytes} bytes", code=ErrorCode.TOO_LARGE
            )
        return data

    def cursor(self) -> dict[str, Any]:
        return self._next

    # listings

    def _everything(self, commit: str, remote: Remote, extra: dict[str, Any]) -> Iterator[Found]:
        for file in parse_tree(self._git("ls-tree", "-r", "-z", "-l", "--full-tree", commit)):
            if regular(file.mode) and selected(file.path, self.settings.include, self.settings.exclude):
                yield self._found(file.path, file.blob, file.size, commit, remote, extra)

    def _changes(
        self,
        base: str,
        commit: str,
        remote: Remote,
        again: AbstractSet[str],
        extra: dict[str, Any],
    ) -> Iterator[Found | Gone]:
        changes = parse_raw_diff(
            self._git("diff-tree", "-r", "-z", "--raw", "--no-renames", "--no-commit-id", base, commit)
        )
        taken = [c for c in changes if selected(c.path, self.settings.include, self.settings.exclude)]
        sizes = self._sizes([c.new_blob for c in taken if c.status != "D" and regular(c.new_mode)])
        for change in taken:
            if change.status == "D" or not regular(change.new_mode):
                if change.status != "A":  # deleted, or no longer a regular file (a link now)
                    yield Gone(change.path)
            else:
                yield self._found(
                    change.path, change.new_blob, sizes.get(change.new_blob), commit, remote, extra
                )
        # What the engine asks for again is looked at as a full listing would.
        listed = {c.path for c in changes}
        unlisted = set(again) - listed
        if unlisted:
            tree = {
                f.path: f
                for f in parse_tree(self._git("ls-tree", "-r", "-z", "-l", "--full-tree", commit))
                if f.path in unlisted
            }
            for key in sorted(unlisted):
                file = tree.get(key)
                if file is None or not regular(file.mode):
                    yield Gone(key)
                elif selected(key, self.settings.include, self.settings.exclude):
                    yield self._found(key, file.blob, file.size, commit, remote, extra)

    def _found(
        self, path: str, blob: str, size: int | None, commit: str, remote: Remote, extra: dict[str, Any]
    ) -> Found:
        error = None
        if size is not None and size > self.max_bytes:
            error = RaglineError(
                f"the file exceeds the limit of {self.max_bytes} bytes", code=ErrorCode.TOO_LARGE
            )
        return Found(
            key=path,
            uri=item_uri(remote.shown, commit, path),
            version=blob,
            doc_id=safe_doc_id(path),
            filename=path.rsplit("/", 1)[-1],
            error=error,
            extra=extra,
        )

    def _sizes(self, blobs: Sequence[str]) -> dict[str, int]:
        if not blobs:
            return {}
        answer = self._git("cat-file", "--batch-check", stdin="\n".join(blobs).encode() + b"\n")
        sizes: dict[str, int] = {}
        for line in answer.decode("ascii").splitlines():
            blob, _kind, size = line.split()
            sizes[blob] = int(size)
        return sizes

    # the cache

    def _prepare(self) -> None:
        """The cache, created when missing; the lock files of a git killed with its worker are
        removed (the run holds its source's lease, so no live git uses this cache)."""
        if (self.cache / "HEAD").is_file():
            for directory, _, files in os.walk(self.cache):
                for name in files:
                    if name.endswith(".lock"):
                        Path(directory, name).unlink(missing_ok=True)
            return
        shutil.rmtree(self.cache, ignore_errors=True)
        self.cache.parent.mkdir(parents=True, exist_ok=True)
        fresh = self.cache.with_name(f"{self.cache.name}.new-{uuid.uuid4().hex[:8]}")
        self._run(["init", "--bare", "--quiet", str(fresh)], "file", cwd=self.cache.parent)
        fresh.rename(self.cache)

    def _pinned(self, known: Mapping[str, ItemState], run_id: str) -> str | None:
        """The commit a resumed run listed before its worker died: the run ends on that commit,
        so the items it already took and those it has yet to take are of one tree."""
        commits = Counter(
            str(s.extra["commit"])
            for s in known.values()
            if s.run_id == run_id and s.outcome in _DONE_OUTCOMES and "commit" in s.extra
        )
        for commit, _ in commits.most_common(1):
            if self._has_commit(commit):
                return commit
        return None

    def _fetch(self, remote: Remote) -> str:
        ref = self.settings.ref
        done = self._run(
            ["fetch", "--depth=1", "--no-tags", "--no-write-fetch-head", "--quiet",
             "--", remote.fetch_from, f"+{ref}:{HEAD_REF}"],
            remote.protocol,
            config=remote.pins,
        )  # fmt: skip
        if done.returncode != 0:
            raise git_error(done.stderr.decode("utf-8", "replace"), f"'{ref}'")
        commit = self._git("rev-parse", "--verify", "--quiet", f"{HEAD_REF}^{{commit}}", check=False)
        if not commit:
            raise PermanentError(f"the ref '{ref}' does not name a commit", code=ErrorCode.NOT_FOUND)
        return commit.decode("ascii").strip()

    def _base(self, commit: str) -> str | None:
        """The commit last synced when the cache holds it (so its tree can be diffed)."""
        last = self.last.get("commit")
        if not isinstance(last, str) or not self._has_commit(last):
            return None
        return last

    def _has_commit(self, commit: str) -> bool:
        if len(commit) not in (40, 64) or not all(c in "0123456789abcdef" for c in commit):
            return False
        return bool(self._git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False))

    # running git

    def _git(self, *args: str, stdin: bytes | None = None, check: bool = True) -> bytes:
        """A command on the cache, which never reaches the network; its output, or b"" when it
        failed and `check` is off."""
        done = self._run(list(args), "", stdin=stdin)
        if done.returncode != 0:
            if not check:
                return b""
            # The cache is damaged (a disk error, a killed gc): the next run starts from a new one.
            shutil.rmtree(self.cache, ignore_errors=True)
            raise RaglineError(
                f"git {args[0]} failed on the source's cache, which is dropped: "
                f"{done.stderr.decode('utf-8', 'replace').strip()[:_STDERR_SHOWN]}",
                code=ErrorCode.INTERNAL,
            )
        return done.stdout

    def _run(
        self,
        args: list[str],
        protocol: str,
        *,
        stdin: bytes | None = None,
        config: Sequence[str] = (),
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """git with the settings above, in an environment of its own, within the time limit."""
        env = {name: os.environ[name] for name in _PASSED_ENV if name in os.environ}
        env.update(
            LC_ALL="C",
            HOME=str(self.cache.parent),
            GIT_CONFIG_NOSYSTEM="1",
            GIT_CONFIG_GLOBAL=os.devnull,
            GIT_TERMINAL_PROMPT="0",
            GIT_ALLOW_PROTOCOL=protocol or "none",
            GIT_DIR=str(self.cache),
        )
        if cwd is not None:
            del env["GIT_DIR"]
        command = ["git", *(f for setting in (*_CONFIG, *config) for f in ("-c", setting)), *args]
        try:
            return subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                cwd=cwd or self.cache,
                env=env,
                timeout=self.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise PermanentError(
                f"git {args[0]} took longer than {self.timeout_s:g}s (RAGLINE_SOURCES__GIT_TIMEOUT_S)",
                code=ErrorCode.TIMEOUT,
            ) from None
        except FileNotFoundError:
            raise PermanentError("git is not installed on this worker", code=ErrorCode.UNAVAILABLE) from None

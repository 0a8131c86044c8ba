"""Fetch and unpack the corpus packages (tests/corpus/packages.py) into a cache; pick the files a run uses.

As /work/shared/eval/build_manbench.py builds manbench, from Debian packages, without installing
them: `apt-get download` and `dpkg-deb -x` into `CACHE/<package>/`, once; a package unpacked
before is taken from the cache. Nothing of it is committed (the cache lies in the state dir).
A package that cannot be fetched raises CorpusError: the test fails, it never skips.

    python -m tests.corpus.build [CACHE]   # fetch everything, print the files per package and type
"""

from __future__ import annotations

import collections
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.corpus.packages import PACKAGES, Package

# Files taken per package in a test run; "all" takes every file (the full corpus).
PER_PACKAGE_ENV = "RAGLINE_TEST_CORPUS_PER_PACKAGE"
DEFAULT_PER_PACKAGE = 8
_DONE = ".unpacked"


class CorpusError(RuntimeError):
    """A package could not be fetched or unpacked."""


@dataclass(frozen=True)
class CorpusFile:
    package: str
    path: Path  # the file in the cache
    relative: str  # its path inside the package

    @property
    def kind(self) -> str:
        """What the file's name says it is: its last suffix, lowercased ("" for none)."""
        return Path(self.relative).suffix.lower()


def per_package() -> int | None:
    """The files per package a run takes, from RAGLINE_TEST_CORPUS_PER_PACKAGE; None: all of them."""
    raw = os.environ.get(PER_PACKAGE_ENV, "").strip().lower()
    if raw in ("all", "0"):
        return None
    if not raw:
        return DEFAULT_PER_PACKAGE
    try:
        count = int(raw)
    except ValueError:
        raise CorpusError(f"{PER_PACKAGE_ENV} must be a positive number or 'all', not {raw!r}") from None
    if count < 0:
        raise CorpusError(f"{PER_PACKAGE_ENV} must be a positive number or 'all', not {raw!r}")
    return count


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def _download(package: str, debs: Path) -> Path:
    """The package's .deb in `debs`, downloaded unless it is there; `apt-get update` once if apt
    does not know the package (a machine whose package lists were never fetched)."""
    found = sorted(debs.glob(f"{package}_*.deb"))
    if found:
        return found[-1]
    result = _run(["apt-get", "download", package], debs)
    if result.returncode != 0 and "Unable to locate package" in result.stderr:
        _run(["apt-get", "update"], debs)
        result = _run(["apt-get", "download", package], debs)
    found = sorted(debs.glob(f"{package}_*.deb"))
    if result.returncode != 0 or not found:
        raise CorpusError(
            f"apt-get download {package} failed (exit {result.returncode}): {result.stderr.strip()[-500:]}"
        )
    return found[-1]


def _unpack(package: Package, cache: Path) -> Path:
    root = cache / package.name
    if (root / _DONE).exists():
        return root
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    deb = _download(package.name, debs)
    staging = Path(tempfile.mkdtemp(prefix=f".{package.name}-", dir=cache))
    result = _run(["dpkg-deb", "-x", str(deb), str(staging)], cache)
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise CorpusError(f"dpkg-deb -x {deb.name} failed: {result.stderr.strip()[-500:]}")
    (staging / _DONE).write_text(deb.name + "\n")
    shutil.rmtree(root, ignore_errors=True)
    staging.rename(root)
    return root


def unpacked(name: str, cache: Path | None = None) -> Path:
    """One Debian package fetched and unpacked into the cache (idempotent): its root directory."""
    if cache is None:
        from shared.config import Settings

        cache = Settings().state_dir / "corpus"
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _unpack(Package(name, "fetched on its own"), cache)


def ensure(cache: Path) -> dict[str, list[CorpusFile]]:
    """Every package fetched and unpacked into `cache` (idempotent); its documents, by package."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes unpack each package once
        roots = {package.name: _unpack(package, cache) for package in PACKAGES}
    out = {}
    for package in PACKAGES:
        files = list(_documents(package, roots[package.name]))
        if not files:
            raise CorpusError(f"{package.name} holds no file under {', '.join(package.roots)}")
        out[package.name] = files
    return out


def _documents(package: Package, root: Path) -> Iterator[CorpusFile]:
    seen: set[Path] = set()
    for sub in package.roots:
        for path in sorted((root / sub).rglob("*")):
            if path.is_file() and not path.is_symlink() and path not in seen:
                seen.add(path)
                yield CorpusFile(package.name, path, path.relative_to(root).as_posix())


def sample(files: list[CorpusFile], count: int | None) -> list[CorpusFile]:
    """`count` files spread over the kinds (suffixes): one of each kind in turn, each kind's files
    in a fixed pseudo-random order (by a hash of their path), so every run picks the same."""
    if count is None or count >= len(files):
        return list(files)
    by_kind: dict[str, list[CorpusFile]] = collections.defaultdict(list)
    for item in files:
        by_kind[item.kind].append(item)
    queues = [
        collections.deque(sorted(group, key=lambda f: hashlib.sha256(f.relative.encode()).digest()))
        for _, group in sorted(by_kind.items())
    ]
    picked: list[CorpusFile] = []
    while len(picked) < count:
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.popleft())
    return picked


def _main(cache: Path) -> None:
    for name, files in ensure(cache).items():
        kinds = collections.Counter(item.kind or "(none)" for item in files)
        print(f"{name:26} {len(files):5} files  {dict(kinds.most_common(6))}")


if __name__ == "__main__":
    from shared.config import Settings

    _main(Path(sys.argv[1]) if len(sys.argv) > 1 else Settings().state_dir / "corpus")

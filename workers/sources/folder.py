"""The `folder` source: a directory the workers can read, under one of the configured roots.

A file's version is its modification time and size, so an unchanged file is never read again. The
walk does not follow directory links, and a file link counts only when it points at a regular file
inside the source's directory: a source must not read what its directory does not hold. A read
checks the file it opened, so a directory swapped for a link after the listing leads nowhere.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

from shared.errors import ErrorCode, PermanentError, RaglineError
from shared.models import safe_doc_id
from shared.sources.models import FolderSettings, ItemState
from workers.sources.connector import Connector, Found, Gone, selected


def inside_roots(path: str, roots: list[Path]) -> Path:
    """The directory `path` names, resolved, when it lies inside a root; else INVALID_ARGUMENT."""
    if not roots:
        raise PermanentError(
            "folder sources are off: RAGLINE_SOURCES__FOLDER_ROOTS names no directory they may read",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    try:
        resolved = Path(path).resolve(strict=True)
    except (OSError, RuntimeError):
        raise PermanentError("the source's directory does not exist", code=ErrorCode.NOT_FOUND) from None
    if not any(resolved.is_relative_to(root.resolve()) for root in roots):
        raise PermanentError(
            "the source's directory is not inside RAGLINE_SOURCES__FOLDER_ROOTS", code=ErrorCode.FORBIDDEN
        )
    if not resolved.is_dir():
        raise PermanentError("the source's path is not a directory", code=ErrorCode.INVALID_ARGUMENT)
    return resolved


class FolderConnector(Connector):
    def __init__(self, settings: FolderSettings, roots: list[Path], max_bytes: int) -> None:
        self.settings = settings
        self.root = inside_roots(settings.path, roots)
        self.max_bytes = max_bytes

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        for directory, subdirs, files in os.walk(self.root, followlinks=False, onerror=_unreadable):
            subdirs.sort()
            for name in sorted(files):
                path = Path(directory, name)
                relative = path.relative_to(self.root).as_posix()
                if not selected(relative, self.settings.include, self.settings.exclude):
                    continue
                info = self._regular(path)
                if info is None:
                    continue
                if not _utf8(relative):
                    # Such a name cannot be stored or shown (JSON holds no lone surrogates); its
                    # key is the name with the undecodable bytes replaced, and the item fails.
                    key = os.fsencode(relative).decode("utf-8", "replace")
                    yield Found(
                        key=key,
                        uri=path.as_uri(),
                        version=None,
                        doc_id=safe_doc_id(key),
                        error=RaglineError(
                            "the file's name is not valid UTF-8; rename it", code=ErrorCode.INVALID_ARGUMENT
                        ),
                    )
                    continue
                yield Found(
                    key=relative,
                    uri=path.as_uri(),
                    version=f"{info.st_mtime_ns}:{info.st_size}",
                    doc_id=safe_doc_id(relative),
                    filename=name,
                )

    def _regular(self, path: Path) -> os.stat_result | None:
        """The file's status when it is a regular file inside the root (through a link too)."""
        try:
            if path.is_symlink() and not path.resolve(strict=True).is_relative_to(self.root):
                return None
            info = path.stat()
        except (OSError, RuntimeError):
            return None  # vanished meanwhile, or a broken or looping link
        return info if stat.S_ISREG(info.st_mode) else None

    def read(self, item: Found) -> bytes:
        path = self.root / item.key
        if self._regular(path) is None:
            raise RaglineError("the file is gone or is no longer a regular file", code=ErrorCode.NOT_FOUND)
        try:
            # Not blocking: a FIFO put in the file's place would otherwise hold the run for ever.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
            with os.fdopen(fd, "rb") as file:
                # What was opened, not what the path named a moment before: a directory on the way
                # may have been swapped for a link since the listing (or the check above).
                if not stat.S_ISREG(os.fstat(fd).st_mode) or not _opened(fd, path).is_relative_to(self.root):
                    raise RaglineError(
                        "the file is no longer a regular file inside the source's directory",
                        code=ErrorCode.NOT_FOUND,
                    )
                data = file.read(self.max_bytes + 1)
        except FileNotFoundError:
            raise RaglineError(
                "the file was deleted while the run listed the folder", code=ErrorCode.NOT_FOUND
            ) from None
        except PermissionError:
            raise RaglineError("the workers may not read the file", code=ErrorCode.FORBIDDEN) from None
        except OSError as error:
            raise RaglineError(
                f"the file could not be read ({error.strerror or type(error).__name__})",
                code=ErrorCode.UNAVAILABLE,
            ) from None
        if len(data) > self.max_bytes:
            raise RaglineError(
                f"the file exceeds the limit of {self.max_bytes} bytes", code=ErrorCode.TOO_LARGE
            )
        return data


def _opened(fd: int, path: Path) -> Path:
    """Where an open file is: what /proc says of its descriptor (Linux), else its path resolved now."""
    try:
        return Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return path.resolve()


def _utf8(name: str) -> bool:
    """Whether a name read from the file system was valid UTF-8 (Python keeps the bytes of one that
    was not as lone surrogates, which no JSON encoder writes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unreadable(error: OSError) -> None:
    """A directory the walk cannot read fails the listing: skipped, its files would read as deleted
    and their documents go. One that vanished meanwhile is gone with its files, as the walk says."""
    if isinstance(error, FileNotFoundError | NotADirectoryError):
        return
    raise RaglineError(
        f"a directory of the source could not be read ({error.strerror or type(error).__name__}); "
        "nothing was deleted",
        code=ErrorCode.UNAVAILABLE,
    )

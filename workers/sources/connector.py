"""What every source type provides to the sync engine: a listing of its items with a version each,
and the bytes of an item the engine decides to take.

A connector never decides what changed: it reports each item with a version (an ETag, a blob id,
a modification time and size), and the engine compares it with what the source remembers. An
incremental connector (git) lists only what changed since its cursor, and says what is gone.
"""

from __future__ import annotations

import fnmatch
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from shared.errors import RaglineError
from shared.sources.models import ItemState


@dataclass(frozen=True)
class Found:
    """One item of the source as listed."""

    key: str  # stable within the source: a relative path, an object key, a URL
    uri: str  # where the original lives: search hits link back to it
    version: str | None  # changes whenever the content may have; None: unknown, always read
    doc_id: str  # the document id it becomes (before the source's prefix)
    filename: str | None = None
    content: bytes | None = None  # read during the listing already (a crawled page)
    mime_type: str | None = None
    unchanged: bool = False  # the source itself said so (an HTTP 304)
    error: RaglineError | None = None  # it could not be read: its document stays as it was
    extra: dict[str, Any] = field(default_factory=dict)  # remembered with the item


@dataclass(frozen=True)
class Gone:
    """An incremental listing's word that an item was deleted at the source."""

    key: str


class Connector(ABC):
    incremental = False  # lists only changes since `cursor`: items it does not name are untouched

    @abstractmethod
    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        """The source's items. `known` is what the source remembers; an item already handled by
        this run (`run_id`, a resumed run) may be skipped or answered from it. An incremental
        listing names the keys in `again` too, changed or not (the engine asks for those whose
        document failed or went); a whole listing names every key anyway."""

    @abstractmethod
    def read(self, item: Found) -> bytes:
        """The item's bytes."""

    def cursor(self) -> dict[str, Any]:
        """What the next run starts from, kept when this one succeeds."""
        return {}

    def close(self) -> None:  # noqa: B027  (most connectors hold nothing)
        """Release what the scan held (connections, checkouts)."""


def selected(path: str, include: list[str], exclude: list[str]) -> bool:
    """A relative path taken by the include globs and not left by the exclude ones ('**' spans
    directories, and 'docs/**' takes docs/ itself too)."""

    def match(pattern: str) -> bool:
        return fnmatch.fnmatchcase(path, pattern) or (
            pattern.startswith("**/") and fnmatch.fnmatchcase(path, pattern[3:])
        )

    return any(match(p) for p in include) and not any(match(p) for p in exclude)

"""The Redis entries a document's text left in the caches derived from it (its chunks' embedding
vectors, its PII findings), listed under the document, so that deleting it removes them too.

Both caches are the tenant's own and keyed by content: one entry serves every document of the
tenant with that text. Each version of a document lists every entry it wrote or read (an entry
in the same transaction as its write), so deleting a document removes every entry any of its
versions used; another live document of the tenant with the same text only computes it again. A
delete sweeps every version up to the record's own, and a stage whose version was superseded or
deleted while it ran sweeps that version's list once it is done (workers/handover.py), so what it
wrote after the delete's sweep goes too.

A list (`ragline:cached-by:{tenant}:{kb}:{doc}:{version}`) expires 30 days after it was last
used, as its entries do: a document whose every version chunks differently never grows one list
without bound. Under `maxmemory` Redis may evict a list before its entries (both have a TTL):
a delete then misses those entries, which expire with their TTL (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import redis

from shared.models import Document

# A chunk's vector serves a re-ingest or an edited version of its document for this long.
EMBEDDING_TTL_S = 30 * 24 * 3600
# A window's findings outlive the turn that analyzed them by this much: the document's next turns,
# and a retry after a failure later in the stage, read them instead of analyzing the window again.
PII_FINDINGS_TTL_S = 24 * 3600
LIST_TTL_S = max(EMBEDDING_TTL_S, PII_FINDINGS_TTL_S)

_DELETE_BATCH = 1000
_LISTS_AT_ONCE = 100


def listing(doc: Document) -> str:
    """The Redis set naming the cache entries this version of the document used."""
    return version_listing(doc.tenant_id, doc.kb_id, doc.doc_id, doc.content_version)


def listings(doc: Document) -> list[str]:
    """The lists of every version of the document up to this one."""
    return [
        version_listing(doc.tenant_id, doc.kb_id, doc.doc_id, v) for v in range(1, doc.content_version + 1)
    ]


def version_listing(tenant_id: str, kb_id: str, doc_id: str, version: int) -> str:
    return f"ragline:cached-by:{tenant_id}:{kb_id}:{doc_id}:{version}"


def read(client: redis.Redis, lists: Mapping[str, Sequence[str]]) -> dict[str, bytes | None]:
    """The value of each key of the lists (None where missing), each listed there as used."""
    keys = sorted({key for mine in lists.values() for key in mine})
    if not keys:
        return {}
    pipe = client.pipeline(transaction=False)
    pipe.mget(keys)
    for name, mine in lists.items():
        note(pipe, name, mine)
    return dict(zip(keys, pipe.execute()[0], strict=True))


def write(client: redis.Redis, lists: Mapping[str, Sequence[tuple[str, str]]], ttl_s: int) -> None:
    """Write the entries (key, value) of each list and list them there, in one transaction: an
    entry is never left written and listed nowhere."""
    pipe = client.pipeline(transaction=True)
    for name, entries in lists.items():
        for key, value in entries:
            pipe.set(key, value, ex=ttl_s)
        note(pipe, name, [key for key, _ in entries])
    pipe.execute()


def note(pipe: redis.client.Pipeline, name: str, keys: Sequence[str]) -> None:
    """Queue on `pipe` the listing of `keys` in `name`."""
    if keys:
        pipe.sadd(name, *keys)
        pipe.expire(name, LIST_TTL_S)  # the list holds the entries of both caches


def forget(client: redis.Redis, docs: Iterable[Document]) -> int:
    """Delete every cache entry the documents used, in every version up to their current one,
    and their lists; returns the entries deleted."""
    return forget_lists(client, [name for doc in docs for name in listings(doc)])


def forget_lists(client: redis.Redis, names: Sequence[str]) -> int:
    """Delete every cache entry these lists name, and the lists; returns the entries deleted."""
    doomed = _Doomed(client)
    for first in range(0, len(names), _LISTS_AT_ONCE):
        lists = names[first : first + _LISTS_AT_ONCE]
        pipe = client.pipeline(transaction=False)
        for name in lists:
            pipe.sscan(name, 0, count=_DELETE_BATCH)
        for name, (cursor, found) in zip(lists, pipe.execute(), strict=True):
            doomed.add(found)
            if cursor:  # a large list: the rest a page at a time (its first page again, harmless)
                for key in client.sscan_iter(name, count=_DELETE_BATCH):
                    doomed.add([key])
        doomed.flush()
        client.unlink(*lists)
    return doomed.deleted


class _Doomed:
    """Keys to delete, deleted a batch at a time. UNLINK frees their memory off Redis's main
    thread, which also serves the broker."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.keys: list[bytes] = []
        self.deleted = 0

    def add(self, keys: list[bytes]) -> None:
        self.keys += keys
        if len(self.keys) >= _DELETE_BATCH:
            self.flush()

    def flush(self) -> None:
        if self.keys:
            self.deleted += int(self.client.unlink(*self.keys))
            self.keys = []

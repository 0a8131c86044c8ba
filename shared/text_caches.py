"""The Redis entries a document's text left in the caches derived from it (its chunks' embedding
vectors, its PII findings), listed under the document, so that deleting it removes them too.

Both caches are the tenant's own and keyed by content: one entry serves every document of the
tenant with that text. A delete removes every entry its document used; another live document of
the tenant with the same text only computes it again. Each document's list
(`ragline:cached-by:{tenant}:{kb}:{doc}`) lives as long as the longest entry it can name, and is
refreshed with each entry it gains. Entries a worker caches for a document while it is being
deleted are listed again and removed by no one, as are those of a list that Redis evicted under
`maxmemory`: they expire with their TTL.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis

# A chunk's vector serves a re-ingest or an edited version of its document for this long.
EMBEDDING_TTL_S = 30 * 24 * 3600
# A window's findings outlive the turn that analyzed them by this much: the document's next turns,
# and a retry after a failure later in the stage, read them instead of analyzing the window again.
PII_FINDINGS_TTL_S = 24 * 3600
LIST_TTL_S = max(EMBEDDING_TTL_S, PII_FINDINGS_TTL_S)

_DELETE_BATCH = 1000
_LISTS_AT_ONCE = 100

DocKey = tuple[str, str, str]  # (tenant_id, kb_id, doc_id)


def listing(doc: DocKey) -> str:
    """The Redis set naming the cache entries `doc` used."""
    tenant_id, kb_id, doc_id = doc
    return f"ragline:cached-by:{tenant_id}:{kb_id}:{doc_id}"


def remember(pipe: redis.client.Pipeline, doc: DocKey, keys: Sequence[str]) -> None:
    """Queue on `pipe` the listing of `keys` (entries `doc` wrote or read) under the document."""
    if keys:
        pipe.sadd(listing(doc), *keys)
        pipe.expire(listing(doc), LIST_TTL_S)


def forget(client: redis.Redis, docs: Iterable[DocKey]) -> int:
    """Delete every cache entry the documents used, and their lists; returns the entries deleted."""
    names = [listing(doc) for doc in docs]
    deleted = 0
    for first in range(0, len(names), _LISTS_AT_ONCE):
        lists = names[first : first + _LISTS_AT_ONCE]
        pipe = client.pipeline(transaction=False)
        for name in lists:
            pipe.smembers(name)
        keys = sorted({key for members in pipe.execute() for key in members})
        for start in range(0, len(keys), _DELETE_BATCH):
            deleted += int(client.delete(*keys[start : start + _DELETE_BATCH]))
        client.delete(*lists)
    return deleted

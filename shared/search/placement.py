"""Where a knowledge base's chunks live: a per-KB alias over one physical chunk index.

Every KB has its own alias, `<prefix>-chunks-kb-<hash>`. A new KB's alias is a filtered alias over
the shared index of the default model in the current layout (the write index of `<prefix>-chunks`);
a KB made before that layout stays on the earlier shared index (shared/search/schema.py). `ragline kb reembed`
moves a KB to an index of its own for the new model, `<prefix>-chunks-<model>-kb-<hash>-v<n>`:
while it copies, the new index carries the KB's "next" alias, and one `_aliases` call then moves
the KB's alias onto it and drops the "next" alias.

The alias is the one switch. The model of an index is recorded in its mapping's `_meta`, so a
reader or writer that resolves the alias pairs its vectors with an index of the same model:
searches query the physical index they resolved (old indexes outlive a swap by a grace period),
writers write through the aliases and check afterwards that they did not move (see
workers/stages/store.py).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

from opensearchpy import OpenSearch
from opensearchpy.exceptions import NotFoundError

from shared.config import Settings
from shared.errors import TransientError
from shared.search.schema import (
    chunk_index_body,
    chunks_alias,
    chunks_index,
    create_index,
    drop_index,
    earlier_shared_indexes,
)

_models: dict[str, tuple[str, int]] = {}  # physical index -> (model, dimension); never changes
# Remembered placements: 2 s is far under the reembed swap grace (10 s, workers/reembed.py), and
# the layering rule keeps shared/ from importing workers/, so the two are kept apart by this note.
PLACEMENT_TTL_S = 2.0
_PLACEMENTS_KEPT = 10_000


@dataclass(frozen=True)
class Placement:
    alias: str
    index: str
    model: str
    dimension: int


def _digest(tenant_id: str, kb_id: str) -> str:
    return hashlib.sha256(f"{tenant_id}/{kb_id}".encode()).hexdigest()[:16]


def kb_alias(settings: Settings, tenant_id: str, kb_id: str) -> str:
    return f"{chunks_alias(settings)}-kb-{_digest(tenant_id, kb_id)}"


def next_alias(settings: Settings, tenant_id: str, kb_id: str) -> str:
    """Names the index a running reembed fills; writers write there too while it exists."""
    return f"{kb_alias(settings, tenant_id, kb_id)}-next"


def kb_index_pattern(settings: Settings, tenant_id: str, kb_id: str) -> str:
    return f"{chunks_alias(settings)}-*-kb-{_digest(tenant_id, kb_id)}-v*"


def kb_index(settings: Settings, tenant_id: str, kb_id: str, model: str, version: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")
    return f"{chunks_alias(settings)}-{slug}-kb-{_digest(tenant_id, kb_id)}-v{version}"


def next_own_index(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str, model: str) -> str:
    """The name of the KB's next index of its own for `model`: one version above any it has, so
    a leftover of an earlier KB of the same id is never reused."""
    own = own_indexes(client, settings, tenant_id, kb_id)
    version = 1 + max((int(name.rsplit("-v", 1)[1]) for name in own), default=0)
    return kb_index(settings, tenant_id, kb_id, model, version)


def attach_to_own(
    client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str, model: str, dimension: int
) -> str:
    """Give a new KB of another model than the default an index of its own, behind its alias.

    A search listing the tenant's KBs sees the KB before its alias exists. `resolve` leaves a KB
    with an index of its own unplaced, and the move takes the alias from every chunk index in the
    same atomic call, wherever a search attached it meanwhile: the alias is never on two indexes.
    A resent create finds the alias on an index of the model already and keeps it.
    """
    alias = kb_alias(settings, tenant_id, kb_id)
    current = aliased(client, [alias]).get(alias)
    if current is not None and index_model(client, current)[0] == model:
        return current
    name = next_own_index(client, settings, tenant_id, kb_id, model)
    create_index(client, name, chunk_index_body(settings, model, dimension, {}))
    anywhere = {"index": f"{chunks_alias(settings)}-*", "alias": alias, "must_exist": False}
    try:
        swap_alias(client, [{"remove": anywhere}, {"add": {"index": name, "alias": alias}}])
    except Exception:
        drop_index(client, name, missing_ok=True)
        raise
    return name


def kb_scope(tenant_id: str, kb_id: str) -> dict[str, Any]:
    return {"bool": {"filter": [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}]}}


def index_model(client: OpenSearch, index: str) -> tuple[str, int]:
    """The (model, dimension) recorded in a chunk index's `_meta`."""
    if index not in _models:
        mapping = client.indices.get_mapping(index=index)[index]["mappings"]
        meta = mapping.get("_meta") or {}
        _models[index] = (str(meta["embedding_model"]), int(meta["embedding_dimension"]))
    return _models[index]


def aliased(client: OpenSearch, aliases: list[str]) -> dict[str, str]:
    """alias -> physical index, for those of `aliases` that exist."""
    try:
        found = client.indices.get_alias(name=",".join(aliases))
    except NotFoundError as error:
        # Some names are missing: the body still lists the ones that exist.
        found = error.info if isinstance(error.info, dict) else {}
    result: dict[str, str] = {}
    for index, entry in found.items():
        if isinstance(entry, dict):
            for alias in entry.get("aliases", {}):
                result[alias] = index
    return result


def attach_to_default(client: OpenSearch, settings: Settings, kbs: list[tuple[str, str]]) -> None:
    """Give KBs without an alias one over a shared index: new KBs the current layout's, and KBs
    older than aliases the earlier layout's index that holds their chunks."""
    current = chunks_index(settings, settings.embedding.model)
    earlier = earlier_shared_indexes(client, settings)
    actions = []
    for t, k in kbs:
        scope = kb_scope(t, k)
        holder = next((i for i in earlier if client.count(index=i, body={"query": scope})["count"]), current)
        actions.append({"add": {"index": holder, "alias": kb_alias(settings, t, k), "filter": scope}})
    if actions:
        swap_alias(client, actions)


def resolve(
    client: OpenSearch, settings: Settings, kbs: list[tuple[str, str]]
) -> dict[tuple[str, str], Placement]:
    """The current placement of each (tenant, kb) that has one.

    A KB without an alias gets one over a shared index here (KBs older than aliases), unless it
    has an index of its own: it is being created on another model (`attach_to_own` is placing
    it), and attaching it to the default model's index would pair its vectors with the wrong
    model. Such a KB has no placement until its creator's swap (a delete still removes it).
    """
    names = {kb_alias(settings, t, k): (t, k) for t, k in kbs}
    if not names:
        return {}
    found = aliased(client, list(names))
    missing = [
        key for alias, key in names.items() if alias not in found and not own_indexes(client, settings, *key)
    ]
    if missing:
        attach_to_default(client, settings, missing)
        found = aliased(client, list(names))
    return {
        names[alias]: _placement(client, alias, index) for alias, index in found.items() if alias in names
    }


class RecentPlacements:
    """`resolve` for searches, remembered for a moment: it saves a cluster-state round trip.

    A placement is kept for PLACEMENT_TTL_S, well under the grace for which a reembed keeps the old
    index whole after moving the alias (workers/reembed.py), so a search that uses a remembered
    placement still finds every chunk there. Writes always resolve afresh.
    """

    def __init__(self, client: OpenSearch, settings: Settings) -> None:
        self._client, self._settings = client, settings
        self._known: dict[tuple[str, str], tuple[float, Placement]] = {}
        self._lock = threading.Lock()

    def __call__(self, kbs: list[tuple[str, str]]) -> dict[tuple[str, str], Placement]:
        now = time.monotonic()
        with self._lock:
            recent = {kb: entry[1] for kb in kbs if (entry := self._known.get(kb)) and entry[0] > now}
        missing = [kb for kb in kbs if kb not in recent]
        if missing:
            found = resolve(self._client, self._settings, missing)
            with self._lock:
                if len(self._known) > _PLACEMENTS_KEPT:
                    self._known = {kb: e for kb, e in self._known.items() if e[0] > now}
                self._known.update({kb: (now + PLACEMENT_TTL_S, p) for kb, p in found.items()})
            recent.update(found)
        return recent


def own_indexes(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str) -> list[str]:
    """The indexes of the KB's own (made by reembeds), by name."""
    return list(client.indices.get(index=kb_index_pattern(settings, tenant_id, kb_id)))


def swap_alias(client: OpenSearch, actions: list[dict[str, Any]]) -> None:
    """Apply alias `actions` in one atomic `_aliases` call."""
    client.indices.update_aliases(body={"actions": actions})


def drop_aliases(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str) -> None:
    """Remove the KB's alias and its "next" alias, wherever they point."""
    aliases = [kb_alias(settings, tenant_id, kb_id), next_alias(settings, tenant_id, kb_id)]
    client.indices.delete_alias(index="_all", name=",".join(aliases), ignore=[404])


def resolve_one(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str) -> Placement:
    """The KB's placement; UNAVAILABLE (worth a retry) while it has none (see `resolve`)."""
    found = resolve(client, settings, [(tenant_id, kb_id)]).get((tenant_id, kb_id))
    if found is None:
        raise TransientError(f"knowledge base '{kb_id}' has no index yet: it is being created or deleted")
    return found


def write_targets(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str) -> list[Placement]:
    """Where a KB's chunk writes go: its alias, plus the index a running reembed fills."""
    current = resolve_one(client, settings, tenant_id, kb_id)
    following = next_alias(settings, tenant_id, kb_id)
    nxt = aliased(client, [following]).get(following)
    if nxt is None or nxt == current.index:
        return [current]
    return [current, _placement(client, following, nxt)]


def write_aliases(client: OpenSearch, settings: Settings, tenant_id: str, kb_id: str) -> str:
    """The aliases a change to a KB's chunks (a delete) must go through, comma-joined."""
    return ",".join(t.alias for t in write_targets(client, settings, tenant_id, kb_id))


def _placement(client: OpenSearch, alias: str, index: str) -> Placement:
    model, dimension = index_model(client, index)
    return Placement(alias=alias, index=index, model=model, dimension=dimension)

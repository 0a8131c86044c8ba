"""A KB's alias is on one index of its own model, whatever a search or a delete does meanwhile.

Real OpenSearch. The races are staged, not hoped for: a search's attach lands between a create's
read of the alias and its swap, a search resolves a KB whose index of its own is not yet behind
its alias, and a delete fails while dropping the KB's own index.
"""

from __future__ import annotations

from typing import Any

import pytest
from opensearchpy import OpenSearch

import shared.catalog as catalog_module
from shared.catalog import Catalog
from shared.config import Settings
from shared.errors import RaglineError
from shared.ingest import Ingestor
from shared.registry import Registry
from shared.search import placement
from shared.search.placement import (
    aliased,
    attach_to_default,
    attach_to_own,
    index_model,
    kb_alias,
    next_own_index,
    own_indexes,
    resolve,
    resolve_one,
)
from shared.search.schema import chunk_index_body, create_index
from tests.integration.helpers import new_kb

pytestmark = pytest.mark.integration

INT8 = ("all-MiniLM-L6-v2-int8", 384)


def _indexes_of(opensearch: OpenSearch, alias: str) -> list[str]:
    return sorted(opensearch.indices.get_alias(name=alias))


def test_a_search_attaching_the_alias_after_the_create_read_it_leaves_it_on_the_own_index_only(
    opensearch: OpenSearch, registry: Registry, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    kb = new_kb(registry)
    alias = kb_alias(settings, kb.tenant_id, kb.kb_id)
    real_aliased = placement.aliased

    def read_then_search_attaches(client: OpenSearch, aliases: list[str]) -> dict[str, str]:
        found = real_aliased(client, aliases)  # the create reads: no alias yet
        attach_to_default(client, settings, [(kb.tenant_id, kb.kb_id)])  # a search lands here
        return found

    monkeypatch.setattr(placement, "aliased", read_then_search_attaches)
    own = attach_to_own(opensearch, settings, kb.tenant_id, kb.kb_id, *INT8)
    monkeypatch.undo()
    assert _indexes_of(opensearch, alias) == [own]
    assert index_model(opensearch, own) == INT8
    assert resolve(opensearch, settings, [(kb.tenant_id, kb.kb_id)])[(kb.tenant_id, kb.kb_id)].index == own


def test_a_search_leaves_a_kb_with_an_own_index_unplaced_until_its_creator_swaps(
    opensearch: OpenSearch, registry: Registry, settings: Settings
) -> None:
    kb = new_kb(registry)
    key = (kb.tenant_id, kb.kb_id)
    alias = kb_alias(settings, *key)
    # What attach_to_own has done just before its swap: the index exists, the alias does not.
    own = next_own_index(opensearch, settings, *key, INT8[0])
    create_index(opensearch, own, chunk_index_body(settings, INT8[0], INT8[1], {}))
    assert resolve(opensearch, settings, [key]) == {}
    assert alias not in aliased(opensearch, [alias])
    with pytest.raises(RaglineError) as refused:
        resolve_one(opensearch, settings, *key)
    assert refused.value.retryable
    swapped = attach_to_own(opensearch, settings, *key, *INT8)
    assert _indexes_of(opensearch, alias) == [swapped]
    assert resolve_one(opensearch, settings, *key).model == INT8[0]


def test_a_delete_that_fails_on_the_kbs_own_index_keeps_the_record_so_it_can_be_resent(
    opensearch: OpenSearch,
    registry: Registry,
    settings: Settings,
    ingestor: Ingestor,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record goes last: while it stands, a create of the same id is refused, so a new KB's
    alias and index are never the ones the delete drops."""
    kb = new_kb(registry)
    attach_to_own(opensearch, settings, kb.tenant_id, kb.kb_id, *INT8)
    catalog = Catalog(settings, registry, ingestor)

    def unreachable(*_: Any, **__: Any) -> None:
        raise ConnectionError("the cluster went away mid-delete")

    monkeypatch.setattr(catalog_module, "drop_index", unreachable)
    with pytest.raises(ConnectionError):
        catalog.delete_kb(kb.tenant_id, kb.kb_id)
    assert registry.get_kb(kb.tenant_id, kb.kb_id).kb_id == kb.kb_id
    monkeypatch.undo()
    catalog.delete_kb(kb.tenant_id, kb.kb_id)
    assert own_indexes(opensearch, settings, kb.tenant_id, kb.kb_id) == []
    with pytest.raises(RaglineError):
        registry.get_kb(kb.tenant_id, kb.kb_id)


def test_a_kb_left_with_an_own_index_and_no_alias_can_still_be_deleted(
    opensearch: OpenSearch, registry: Registry, settings: Settings, ingestor: Ingestor
) -> None:
    """A create on another model that failed between its index and its alias (and whose rollback
    failed too) left a KB that no search places: its delete answered UNAVAILABLE for ever."""
    kb = new_kb(registry)
    key = (kb.tenant_id, kb.kb_id)
    own = next_own_index(opensearch, settings, *key, INT8[0])
    create_index(opensearch, own, chunk_index_body(settings, INT8[0], INT8[1], {}))
    Catalog(settings, registry, ingestor).delete_kb(*key)
    assert own_indexes(opensearch, settings, *key) == []
    with pytest.raises(RaglineError):
        registry.get_kb(*key)

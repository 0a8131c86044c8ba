"""KB snapshots: inside `Registry.kb_snapshots()` a knowledge base is read once, outside it afresh."""

from __future__ import annotations

from shared.registry import Registry
from tests.integration.helpers import new_kb


def test_a_task_sees_one_version_of_a_kb_and_the_next_task_sees_the_change(registry: Registry) -> None:
    kb = new_kb(registry, chunk_size=200)
    with registry.kb_snapshots():
        first = registry.get_kb(kb.tenant_id, kb.kb_id)
        first.settings.chunk_size = 250  # a caller's change to its copy stays its own
        registry.save_kb(kb.model_copy(update={"name": "renamed"}))
        again = registry.get_kb(kb.tenant_id, kb.kb_id)
        assert (again.name, again.settings.chunk_size) == ("test", 200)
    after = registry.get_kb(kb.tenant_id, kb.kb_id)
    assert (after.name, after.settings.chunk_size) == ("renamed", 200)


def test_nested_blocks_and_other_kbs_are_read_on_their_own(registry: Registry) -> None:
    one, two = new_kb(registry), new_kb(registry)
    with registry.kb_snapshots():
        assert registry.get_kb(one.tenant_id, one.kb_id).tenant_id == one.tenant_id
        registry.save_kb(two.model_copy(update={"name": "second"}))
        assert registry.get_kb(two.tenant_id, two.kb_id).name == "second"
        registry.save_kb(one.model_copy(update={"name": "first"}))
        with registry.kb_snapshots():
            assert registry.get_kb(one.tenant_id, one.kb_id).name == "first"
        assert registry.get_kb(one.tenant_id, one.kb_id).name == "test"

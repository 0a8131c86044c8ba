"""The fair feeder's turn order: tenants take turns, a tenant's knowledge bases share its turn."""

from __future__ import annotations

from shared.fairqueue import lane, lane_tenant, lanes_by_tenant, rotated


def test_lanes_group_by_tenant_whatever_their_kb_count() -> None:
    lanes = [lane("big", f"kb{i}") for i in range(5)] + [lane("small", "only")]
    grouped = lanes_by_tenant(lanes)
    assert sorted(grouped) == ["big", "small"]
    assert grouped["big"] == sorted(lane("big", f"kb{i}") for i in range(5))
    assert grouped["small"] == [lane("small", "only")]


def test_a_kb_id_with_separators_keeps_its_tenant() -> None:
    assert lane_tenant(lane("t-1", "k/with/slashes")) == "t-1"


def test_turns_rotate_through_every_item() -> None:
    items = ["a", "b", "c"]
    assert [rotated(items, turn)[0] for turn in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert rotated(items, 4) == ["b", "c", "a"]

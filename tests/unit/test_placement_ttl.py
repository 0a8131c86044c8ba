"""Searches remember a KB's placement for less time than a reembed keeps the old index whole."""

from __future__ import annotations

from shared.search.placement import PLACEMENT_TTL_S
from workers.reembed import SWAP_GRACE_S


def test_a_remembered_placement_expires_well_inside_the_swap_grace() -> None:
    # A search may resolve just before the swap and run just before the TTL ends: the old index
    # must still hold every chunk then, with time to spare for the search itself.
    assert 2 * PLACEMENT_TTL_S <= SWAP_GRACE_S

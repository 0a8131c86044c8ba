"""The bench's wait for OpenSearch's merges: one reading of none running is not enough, since a
refresh writes a segment and its merge starts a moment later."""

from __future__ import annotations

from typing import Any

from shared.search.chunk_index import await_merges


class _ScriptedStats:
    """Index stats that answer each `merge` request with the next (current, total) of a script,
    then the last one for ever."""

    def __init__(self, script: list[tuple[int, int]]) -> None:
        self.script, self.asked = script, 0
        self.indices = self

    def stats(self, *, index: str, metric: str) -> dict[str, Any]:
        current, total = self.script[min(self.asked, len(self.script) - 1)]
        self.asked += 1
        return {"_all": {"total": {"merges": {"current": current, "total": total}}}}


def test_a_merge_starting_after_a_first_quiet_reading_is_waited_for() -> None:
    stats = _ScriptedStats([(0, 4), (1, 4), (0, 5), (0, 5)])
    assert await_merges(stats, "chunks", timeout_s=30, settle_s=0.6)  # type: ignore[arg-type]
    # Quiet at the first reading, then the merge ran: the wait restarted once it ended.
    assert stats.asked >= 5


def test_merges_that_ended_between_two_readings_restart_the_quiet_span() -> None:
    stats = _ScriptedStats([(0, 4), (0, 6), (0, 6)])
    assert await_merges(stats, "chunks", timeout_s=30, settle_s=0.6)  # type: ignore[arg-type]
    assert stats.asked >= 4


def test_merges_that_never_end_are_a_timeout_not_a_success() -> None:
    stats = _ScriptedStats([(1, 0)])
    assert not await_merges(stats, "chunks", timeout_s=0.2)  # type: ignore[arg-type]

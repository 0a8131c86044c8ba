"""The PII stage analyzes a long text in turns: each window's findings are cached in Redis, so a
turn that ran out goes on where it stopped, and the findings are those of one whole analysis.
Real Presidio and the stack's Redis; the cache is each tenant's own."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
import redis

from shared import text_caches
from workers.stages import pii
from workers.stages.base import TurnEnded, TurnTally

ENTITIES = ["EMAIL_ADDRESS", "PERSON"]


def _text(windows: int) -> str:
    """A text of just over `windows` - 1 analysis windows (so, `windows` of them), with an address
    planted every few hundred characters."""
    rng = random.Random(7)
    words = ["harbour", "cargo", "tide", "berth", "vessel", "pilot", "manifest", "crane"]
    lines: list[str] = []
    size = 0
    while len(pii.analysis_windows(size)) < windows:
        line = " ".join(rng.choice(words) for _ in range(8))
        if len(lines) % 40 == 0:
            line += f" Write to dana{len(lines)}@example.com today."
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)


class _Counting:
    """The real analyzer, counting the windows it is given."""

    def __init__(self, real: Any) -> None:
        self.real, self.calls = real, 0

    def analyze(self, **kwargs: Any) -> Any:
        self.calls += 1
        return self.real.analyze(**kwargs)


def _doc() -> tuple[str, str, str]:
    """A document of a tenant of its own: (tenant_id, kb_id, doc_id)."""
    return (f"t-{uuid.uuid4().hex[:8]}", "kb", "doc")


def _listing(doc: tuple[str, str, str]) -> str:
    """Where the document's first version lists the findings it used."""
    return text_caches.version_listing(*doc, 1)


def test_a_text_analyzed_in_turns_finds_what_one_analysis_finds_each_window_once(
    redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _text(3)
    counting = _Counting(pii.analyzer())
    monkeypatch.setattr(pii, "analyzer", lambda: counting)

    # Another tenant's analysis of the same text, in one turn: the reference, and its cache.
    first = _doc()
    other = pii.find(
        text, ENTITIES, 0.3, pii.Turn(redis_client, first, ENTITIES, 0.3, [text], listing=_listing(first))
    )
    assert counting.calls == 3
    assert sum(f.entity == "EMAIL_ADDRESS" for f in other) >= 50

    doc, tallies = _doc(), []
    while True:  # no time for more than one window a turn
        turn = pii.Turn(redis_client, doc, ENTITIES, 0.3, [text], turn_s=0, listing=_listing(doc))
        try:
            found = pii.find(text, ENTITIES, 0.3, turn)
            break
        except TurnEnded as ended:
            tallies.append(ended.tallies[doc])
    assert tallies == [TurnTally(1, 3, 1), TurnTally(2, 3, 1)]
    # Three windows more, not read from the other tenant's cache: 3 + 3 analyses in all.
    assert counting.calls == 6
    assert found == other

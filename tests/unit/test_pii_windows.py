"""The PII stage's analysis windows: a value on a window border is found whole, and once.

Presidio is replaced by a stand-in that finds values by pattern inside the window it is given,
as Presidio's own recognizers do: a value cut by a window's end is not found in that window.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

import pytest

from shared.models import PiiPolicy
from workers.stages import pii
from workers.stages.pii import WINDOW_OVERLAP, Finding, analysis_windows, find

_PATTERNS = {
    "EMAIL_ADDRESS": re.compile(r"[a-z.]+@example\.com"),
    "PHONE_NUMBER": re.compile(r"\(\d{3}\) \d{3}-\d{4}"),
    "CREDIT_CARD": re.compile(r"\d{4} \d{4} \d{4} \d{4}"),
}
_VALUES = {
    "EMAIL_ADDRESS": "dana.whitfield@example.com",
    "PHONE_NUMBER": "(212) 555-0198",
    "CREDIT_CARD": "4111 1111 1111 1111",
}


@dataclass(frozen=True)
class _Result:
    start: int
    end: int
    entity_type: str
    score: float


class _PatternAnalyzer:
    """What `pii.analyzer()` returns, reduced to whole pattern matches inside one window."""

    def __init__(self) -> None:
        self.windows: list[int] = []

    def analyze(self, text: str, language: str, entities: list[str], score_threshold: float) -> list[_Result]:
        self.windows.append(len(text))
        return [
            _Result(m.start(), m.end(), entity, 1.0)
            for entity, pattern in _PATTERNS.items()
            if entity in entities
            for m in pattern.finditer(text)
        ]


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> _PatternAnalyzer:
    fake = _PatternAnalyzer()
    monkeypatch.setattr(pii, "analyzer", lambda: fake)
    return fake


def _plant(length: int, places: list[tuple[int, str]]) -> tuple[str, list[tuple[int, int, str]]]:
    """Filler text of `length` characters with each value placed so that it covers its point."""
    text = list(("lorem ipsum dolor sit amet " * (length // 27 + 1))[:length])
    spans = []
    for point, entity in places:
        value = _VALUES[entity]
        start = point - len(value) // 2
        text[start - 1 : start + len(value) + 1] = f" {value} "
        spans.append((start, start + len(value), entity))
    return "".join(text), spans


def test_windows_overlap_and_cover_the_text() -> None:
    for length in (1, 999, 1_000, 1_001, 2_500, 10_000, 12_345):
        windows = analysis_windows(length, size=1_000, overlap=100)
        assert windows[0][0] == 0
        assert windows[-1][1] == length
        for (_, end), (start, _) in itertools.pairwise(windows):
            assert end - start == 100  # each border lies inside the next window
        assert all(end - start <= 1_000 for start, end in windows)
    assert analysis_windows(0) == []


def test_every_span_as_long_as_the_overlap_lies_whole_in_one_window() -> None:
    size, overlap, length = 1_000, 100, 5_000
    windows = analysis_windows(length, size=size, overlap=overlap)
    for start in range(0, length - overlap + 1):
        end = start + overlap
        assert any(lo <= start and end <= hi for lo, hi in windows), (start, end)


def test_the_overlap_is_longer_than_any_default_entity_value() -> None:
    assert WINDOW_OVERLAP > 254  # the longest e-mail address SMTP carries (RFC 5321)


def test_values_on_every_border_of_a_long_text_are_found_whole_and_once(stand_in: _PatternAnalyzer) -> None:
    windows = analysis_windows(310_000)
    assert len(windows) == 4
    borders = [end for _, end in windows[:-1]]  # where a window is cut
    starts = [start for start, _ in windows[1:]]  # where the next one begins
    # Each border and each start carries a value across it, of a different kind each time;
    # 100,001 is the place of the phone number that came back raw (99,994-100,008).
    entities = list(_VALUES)
    places = [(b, entities[i % 3]) for i, b in enumerate(borders)] + [
        (s, entities[(i + 1) % 3]) for i, s in enumerate(starts)
    ]
    text, spans = _plant(310_000, [(100_001, "PHONE_NUMBER"), *places[1:]])
    assert text[99_994:100_008] == "(212) 555-0198"

    findings = find(text, list(_VALUES), 0.3)

    assert len(stand_in.windows) == len(windows)
    assert sorted((f.start, f.end, f.entity) for f in findings) == sorted(spans)


def test_redaction_of_a_border_value_found_twice_replaces_it_once(stand_in: _PatternAnalyzer) -> None:
    text, [(start, end, _)] = _plant(150_000, [(analysis_windows(150_000)[1][0] + 10, "EMAIL_ADDRESS")])
    findings = find(text, ["EMAIL_ADDRESS"], 0.3)
    assert findings == [Finding(start, end, "EMAIL_ADDRESS", 1.0)]
    redacted, _ = pii.apply(text, 0, findings, PiiPolicy.REDACT, b"")
    assert redacted == text[:start] + "<EMAIL_ADDRESS>" + text[end:]

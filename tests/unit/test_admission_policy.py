"""Which requests may take the interactive queue: the one policy both fronts and re-ingest call."""

from __future__ import annotations

import os

import pytest

from shared.admission import may_be_interactive
from shared.config import Settings, load_settings
from shared.errors import ErrorCode, RaglineError

SMALL = 1 << 10


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RAGLINE_"):
            monkeypatch.delenv(name)


@pytest.fixture
def settings() -> Settings:
    return load_settings(api={"interactive_max_bytes": 4 * SMALL, "interactive_max_in_flight": 2})


@pytest.mark.parametrize("priority", [None, "interactive"])
def test_one_small_document_may_be_interactive_unless_the_caller_opts_out(
    settings: Settings, priority: str | None
) -> None:
    assert may_be_interactive(settings, priority, [SMALL])
    assert not may_be_interactive(settings, "bulk", [SMALL])


@pytest.mark.parametrize(
    "sizes",
    [
        [4 * SMALL + 1],  # over the bound
        [None],  # a stream whose size is not known before reading
        [SMALL, SMALL],  # more than one document
        [],
    ],
)
def test_anything_but_one_small_document_of_known_size_goes_to_the_lanes(
    settings: Settings, sizes: list[int | None]
) -> None:
    assert not may_be_interactive(settings, "interactive", sizes)


def test_the_bound_is_inclusive(settings: Settings) -> None:
    assert may_be_interactive(settings, None, [4 * SMALL])


def test_a_deployment_without_the_interactive_queue_or_quota_sends_everything_to_the_lanes() -> None:
    assert not may_be_interactive(load_settings(celery={"queues": ["bulk"]}), None, [SMALL])
    assert not may_be_interactive(load_settings(api={"interactive_max_in_flight": 0}), None, [SMALL])


@pytest.mark.parametrize("priority", ["urgent", "", "BULK"])
def test_an_unknown_priority_is_refused_with_a_stable_code(settings: Settings, priority: str) -> None:
    with pytest.raises(RaglineError) as refused:
        may_be_interactive(settings, priority, [SMALL])
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT
    assert refused.value.details == {"field": "priority"}

"""The share of a source's documents one run may delete (workers/sources/sync.py)."""

from __future__ import annotations

import pytest
from pydantic import TypeAdapter, ValidationError

from shared.errors import ErrorCode, RaglineError
from shared.sources.models import Source, SourceSpec, SourceType
from workers.sources.sync import check_deletions


def _source(share: float, held: bool = False) -> Source:
    return Source(
        tenant_id="t",
        kb_id="kb",
        source_id="s",
        type=SourceType.FOLDER,
        settings={},
        max_deleted_share=share,
        deletions_held=held,
    )


@pytest.mark.parametrize(
    ("share", "missing", "live", "refused"),
    [
        (0.5, 1, 1, False),  # one document may always go: a one-page source's page removed
        (0.5, 2, 2, True),
        (0.5, 2, 4, False),  # half exactly
        (0.5, 3, 4, True),
        (0.5, 3, 100, False),
        (1.0, 100, 100, False),  # the check off
        (0.0, 2, 100, True),
        (0.0, 1, 100, False),
    ],
)
def test_a_run_may_delete_up_to_its_share(share: float, missing: int, live: int, refused: bool) -> None:
    if not refused:
        check_deletions(_source(share), missing, live)
        return
    with pytest.raises(RaglineError) as caught:
        check_deletions(_source(share), missing, live)
    assert caught.value.code == ErrorCode.CONFLICT
    assert f"would delete {missing} of the source's {live} documents" in caught.value.message


def test_once_refused_a_source_holds_its_deletions_whatever_the_share() -> None:
    # The refused run ingested what it found: the next run's share of 10 in 20 would pass.
    check_deletions(_source(0.5), 10, 20)
    with pytest.raises(RaglineError, match="held since a run"):
        check_deletions(_source(0.5, held=True), 10, 20)
    check_deletions(_source(0.5, held=True), 1, 20)  # the source whole again: let go


@pytest.mark.parametrize("value", [True, "0.3", None, -0.1, 1.5])
def test_the_share_is_a_number_from_0_to_1(value: object) -> None:
    spec = {"type": "folder", "settings": {"path": "/srv/x"}, "max_deleted_share": value}
    with pytest.raises(ValidationError):
        TypeAdapter(SourceSpec).validate_python(spec)
    assert TypeAdapter(SourceSpec).validate_python({**spec, "max_deleted_share": 1}).max_deleted_share == 1.0

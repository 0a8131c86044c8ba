"""Knowledge-base settings: every combination accepted is one that can be stored and read back."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from shared.models import KbSettings, KnowledgeBase


@pytest.mark.parametrize("given", [{"chunk_size": 64}, {"chunk_size": 40, "chunk_overlap": 20}])
def test_an_overlap_of_half_the_chunk_or_more_is_refused_default_or_not(given: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match="less than half of chunk_size"):
        KbSettings.model_validate(given)


def test_accepted_settings_survive_a_round_trip_through_storage() -> None:
    settings = KbSettings.model_validate({"chunk_size": 64, "chunk_overlap": 31})
    kb = KnowledgeBase(tenant_id="t", kb_id="kb", name="kb", settings=settings)
    assert KnowledgeBase.model_validate(kb.model_dump(mode="json")).settings == settings

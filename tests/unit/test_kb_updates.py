"""A knowledge base's embedding model changes only as the end of its reembed."""

from __future__ import annotations

import pytest

from shared.models import KnowledgeBase, Reembed
from shared.registry import Conflict, _check_model_change

MINI, MPNET = ("all-MiniLM-L6-v2", 384), ("all-mpnet-base-v2", 768)


def _kb(model: tuple[str, int], reembed: str | None = None) -> KnowledgeBase:
    return KnowledgeBase(
        tenant_id="t",
        kb_id="kb",
        name="n",
        embedding_model=model[0],
        embedding_dimension=model[1],
        reembed=Reembed(model=reembed) if reembed else None,
    )


def test_the_end_of_a_reembed_may_change_the_model() -> None:
    _check_model_change(_kb(MINI, reembed=MPNET[0]), _kb(MPNET))


def test_other_changes_keep_the_model() -> None:
    _check_model_change(
        _kb(MINI, reembed=MPNET[0]), _kb(MINI, reembed=MPNET[0]).model_copy(update={"name": "x"})
    )
    _check_model_change(_kb(MINI), _kb(MINI))


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (_kb(MINI), _kb(MPNET)),  # no reembed runs
        (_kb(MINI, reembed=MPNET[0]), _kb(MPNET, reembed=MPNET[0])),  # during the reembed
        (_kb(MINI, reembed=MPNET[0]), _kb(("/srv/models/other", 384))),  # to another model than asked
    ],
)
def test_any_other_model_change_is_a_conflict(before: KnowledgeBase, after: KnowledgeBase) -> None:
    with pytest.raises(Conflict):
        _check_model_change(before, after)

"""A knowledge base's embedding model changes only as the end of its reembed, and only to a model
the server knows; a model's exports stay inside the model cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared import embedding
from shared.config import EmbeddingSettings
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


def test_a_local_model_is_exported_inside_the_cache_never_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "somewhere" / "model"
    model.mkdir(parents=True)
    (model / "tokenizer.json").write_text("{}")
    written: list[Path] = []
    monkeypatch.setattr(embedding, "export_onnx", lambda _directory, target: written.append(target))
    settings = EmbeddingSettings(model=str(model), cache_dir=tmp_path / "cache")
    target = embedding.onnx_model_path(settings)
    assert written == [target]
    assert target.is_relative_to(tmp_path / "cache")
    assert list(model.iterdir()) == [model / "tokenizer.json"]


def test_only_packaged_and_configured_models_can_be_moved_to() -> None:
    settings = EmbeddingSettings(extra_models=("/srv/models/own",))
    assert embedding.servable_models(settings) == sorted([*embedding.known_models(), "/srv/models/own"])
    assert "/etc" not in embedding.servable_models(settings)

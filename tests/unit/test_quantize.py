"""The int8 variant is made from the fp32 export alone, the same bytes each time, once, and never
loaded from a cache file that its stamp does not vouch for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from shared.config import load_settings
from shared.embedding import INT8_MODELS, OnnxEncoder, encoder, for_model, model_dir, onnx_model_path
from shared.quantize import Int8Recipe, quantized_model, stamp_path

INT8 = "all-MiniLM-L6-v2-int8"
RECIPE = INT8_MODELS[INT8]
TEXTS = [
    "How do I reset my password?",
    "grep searches the named input files for lines containing a match to the given pattern.",
    "Manual › Installation\nRun the installer twice, then reboot.",
]


@pytest.fixture(scope="module")
def fp32_export() -> Path:
    return onnx_model_path(for_model(load_settings().embedding, INT8_MODELS[INT8].model))


@pytest.fixture(scope="module")
def made_once(fp32_export: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    target = tmp_path_factory.mktemp("int8") / "model.onnx"
    quantized_model(fp32_export, target, RECIPE)
    return target, target.read_bytes()


def test_the_same_export_gives_the_same_bytes(
    made_once: tuple[Path, bytes], fp32_export: Path, tmp_path: Path
) -> None:
    again = quantized_model(fp32_export, tmp_path / "model.onnx", RECIPE)
    assert again.read_bytes() == made_once[1]
    stamp = json.loads(stamp_path(again).read_text())
    assert stamp == json.loads(stamp_path(made_once[0]).read_text())
    assert set(stamp) == {"recipe", "source_sha256", "sha256"}


def test_a_vouched_cache_is_used_as_it_is(made_once: tuple[Path, bytes], fp32_export: Path) -> None:
    target = made_once[0]
    before = target.stat()
    assert quantized_model(fp32_export, target, RECIPE) == target
    after = target.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


@pytest.mark.parametrize("damage", ["flipped byte", "truncated", "stamp of another export", "no stamp"])
def test_a_damaged_cache_is_made_again_not_loaded(
    made_once: tuple[Path, bytes], fp32_export: Path, tmp_path: Path, damage: str
) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(made_once[1])
    stamp_path(target).write_text(stamp_path(made_once[0]).read_text())
    if damage == "flipped byte":
        data = bytearray(made_once[1])
        data[len(data) // 2] ^= 0x40  # inside the weights: ONNX Runtime would load it silently
        target.write_bytes(bytes(data))
    elif damage == "truncated":
        target.write_bytes(made_once[1][: len(made_once[1]) // 3])
    elif damage == "stamp of another export":
        stamp = json.loads(stamp_path(target).read_text())
        stamp_path(target).write_text(json.dumps({**stamp, "source_sha256": "0" * 64}))
    else:
        stamp_path(target).unlink()
    quantized_model(fp32_export, target, RECIPE)
    assert target.read_bytes() == made_once[1]
    assert json.loads(stamp_path(target).read_text()) == json.loads(stamp_path(made_once[0]).read_text())


def test_the_recipe_keeps_its_nodes_in_fp32_and_quantizes_the_other_matmuls(
    made_once: tuple[Path, bytes],
) -> None:
    graph = onnx.load(made_once[0]).graph
    kinds = {node.name: node.op_type for node in graph.node}
    assert RECIPE.keep_fp32
    assert all(kinds[name] == "MatMul" for name in RECIPE.keep_fp32)
    assert sum(kind == "MatMulInteger" for kind in kinds.values()) == 36 - len(RECIPE.keep_fp32)


def test_another_recipe_in_the_same_place_is_made_anew(
    made_once: tuple[Path, bytes], fp32_export: Path, tmp_path: Path
) -> None:
    target = tmp_path / "model.onnx"
    target.write_bytes(made_once[1])
    stamp_path(target).write_text(stamp_path(made_once[0]).read_text())
    everything = Int8Recipe(RECIPE.model)
    quantized_model(fp32_export, target, everything)
    assert target.read_bytes() != made_once[1]
    assert json.loads(stamp_path(target).read_text())["recipe"]["keep_fp32"] == []


def test_a_recipe_naming_nodes_the_export_lacks_is_refused(fp32_export: Path, tmp_path: Path) -> None:
    target = tmp_path / "model.onnx"
    wrong = Int8Recipe(RECIPE.model, keep_fp32=("/model/encoder/layer.9/output/dense/MatMul",))
    with pytest.raises(ValueError, match=r"layer\.9"):
        quantized_model(fp32_export, target, wrong)
    assert list(tmp_path.iterdir()) == []


def test_int8_vectors_are_close_to_fp32_but_their_own(made_once: tuple[Path, bytes]) -> None:
    settings = load_settings().embedding
    fp32 = encoder(for_model(settings, INT8_MODELS[INT8].model))
    directory = model_dir(INT8)
    int8 = OnnxEncoder(directory, made_once[0], settings.batch_size, settings.batch_tokens, threads=1)
    a, b = fp32.encode(TEXTS), int8.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cosines = (a * b).sum(axis=1)
    assert cosines.min() > 0.98
    # Not the fp32 vectors: an index must never hold both, which is why the variant has its own name.
    assert cosines.max() < 0.99999


def test_the_variant_is_served_by_name_from_the_cache_on_any_backend() -> None:
    settings = load_settings().embedding
    int8 = for_model(settings, INT8).model_copy(update={"backend": "sentence-transformers"})
    made = encoder(int8)
    assert isinstance(made, OnnxEncoder)
    path = onnx_model_path(int8)
    assert path == settings.cache_dir / INT8 / "model.onnx"
    assert stamp_path(path).is_file()

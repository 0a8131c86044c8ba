"""The int8 variant of an exported model: ONNX Runtime's dynamic quantization, made once into the
model cache and checked at every load.

Dynamic quantization stores the weights of the linear layers as int8 and quantizes each layer's
input at run time, so the encoder runs integer matrix products on the CPU; nothing but the fp32
export is needed, and the same export gives the same bytes. The recipe is what measured best on
manbench chunks for speed and for closeness to the fp32 vectors (docs/benchmarks.md#int8-model):

- int8 weights (QInt8): with uint8 activations that is the u8s8 product the CPU's integer dot
  instructions take; uint8 weights ran slower and further from fp32.
- one scale per output channel: a scale per tensor let a few wide columns flatten the rest.
- the MatMul weights only: the embedding tables stay fp32 (a lookup, no arithmetic to save).

A cached file is used only when its stamp names this recipe, the digest of the export it was made
from and its own digest: a truncated or altered file, or one made from another export, is made
again, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Int8Recipe:
    """How an int8 variant is made from the fp32 export of `model`; fixed once its vectors are in
    use (an index and the embedding cache keep them under the variant's name)."""

    model: str
    # MatMul nodes of that model's export left in fp32: the ones whose int8 form moved the vectors
    # most for the least of the speed.
    keep_fp32: tuple[str, ...] = ()

    def describe(self) -> dict[str, Any]:
        return {
            "method": "onnxruntime.quantize_dynamic",
            "weight_type": "QInt8",
            "per_channel": True,
            "op_types": ["MatMul"],
            "keep_fp32": list(self.keep_fp32),
        }


def quantized_model(source: Path, target: Path, recipe: Int8Recipe) -> Path:
    """`target`, the int8 variant of the fp32 export `source`: from the cache when its stamp vouches
    for it, made (again) otherwise. Callers in one process hold a lock; processes may race, and
    then both write the same bytes."""
    expected = {"recipe": recipe.describe(), "source_sha256": _sha256(source)}
    stamp = stamp_path(target)
    if target.is_file() and stamp.is_file():
        try:
            recorded = json.loads(stamp.read_text())
        except ValueError:
            recorded = None
        if recorded == {**expected, "sha256": _sha256(target)}:
            return target
        log.warning("the cached int8 model %s does not match its stamp; making it again", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    _quantize(source, target, recipe, expected)
    return target


def stamp_path(target: Path) -> Path:
    return target.with_name(f"{target.name}.stamp.json")


def _quantize(source: Path, target: Path, recipe: Int8Recipe, expected: dict[str, Any]) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # quantize_dynamic passes over names it does not find: an export whose nodes were renamed
    # would quietly lose the fp32 layers the recipe keeps.
    missing = set(recipe.keep_fp32) - {node.name for node in onnx.load(source).graph.node}
    if missing:
        raise ValueError(f"the export {source} has none of the nodes {sorted(missing)} the int8 recipe keeps")
    fd, model_tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx")
    os.close(fd)
    fd, stamp_tmp = tempfile.mkstemp(dir=target.parent, suffix=".json")
    os.close(fd)
    try:
        quantize_dynamic(
            source,
            model_tmp,
            op_types_to_quantize=["MatMul"],
            per_channel=True,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=list(recipe.keep_fp32),
        )
        Path(stamp_tmp).write_text(json.dumps({**expected, "sha256": _sha256(Path(model_tmp))}))
        # Model first, then its stamp: a reader between the two sees a mismatch and makes its own.
        os.replace(model_tmp, target)
        os.replace(stamp_tmp, stamp_path(target))
    finally:
        Path(model_tmp).unlink(missing_ok=True)
        Path(stamp_tmp).unlink(missing_ok=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

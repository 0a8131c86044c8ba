"""The ONNX Runtime encoder gives the sentence-transformers vectors (same packaged weights)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from shared.config import EmbeddingSettings, load_settings
from shared.embedding import (
    SentenceTransformerEncoder,
    TooLong,
    encoder,
    indexed_vector,
    model_dir,
    token_batches,
)
from workers.stages.embed import decode_b64, encode_b64

TEXTS = [
    "How do I reset my password?",
    "The printf function writes formatted output to stdout.",
    "Ragline ingests documents asynchronously and serves them to agents. " * 12,
    "x",
    "Manual › Installation\nRun the installer twice, then reboot.",
]


def test_onnx_matches_sentence_transformers() -> None:
    settings = load_settings().embedding
    fast = encoder(settings)
    reference = SentenceTransformerEncoder(model_dir(settings.model), batch_size=8)
    a, b = fast.encode(TEXTS), reference.encode(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384)
    cosines = (a * b).sum(axis=1)
    print(f"min cosine ONNX vs sentence-transformers: {cosines.min():.6f}")
    assert cosines.min() >= 0.999
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)


def test_the_sentence_transformers_backend_is_chosen_by_settings_on_its_device() -> None:
    """The GPU path is this one with `device=cuda`; on a CPU machine it runs on the CPU."""
    settings = load_settings().embedding
    chosen = encoder(settings.model_copy(update={"backend": "sentence-transformers", "device": "cpu"}))
    assert isinstance(chosen, SentenceTransformerEncoder)
    assert chosen.device == "cpu"
    cosines = (chosen.encode(TEXTS) * encoder(settings).encode(TEXTS)).sum(axis=1)
    assert cosines.min() >= 0.999


@pytest.mark.parametrize("precision", ["float16", "bfloat16"])
def test_the_sentence_transformers_backend_at_half_precision_stays_close_to_float32(precision: str) -> None:
    """The GPU's fast path, run here on the CPU: the same code, the weights cast to `precision`."""
    settings = load_settings().embedding
    half = encoder(settings.model_copy(update={"backend": "sentence-transformers", "precision": precision}))
    assert isinstance(half, SentenceTransformerEncoder)
    assert half.precision == precision
    vectors = half.encode(TEXTS)
    assert vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    cosines = (vectors * encoder(settings).encode(TEXTS)).sum(axis=1)
    assert cosines.min() >= 0.99
    assert half.encode([]).shape == (0, 384)


def test_a_precision_torch_does_not_name_is_refused() -> None:
    with pytest.raises(ValidationError):
        EmbeddingSettings(precision="int4")


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:1", "mps"])
def test_devices_torch_names_are_accepted(device: str) -> None:
    assert EmbeddingSettings(device=device).device == device


@pytest.mark.parametrize("device", ["gpu", "cuda:", "CUDA", "cuda:0; rm", ""])
def test_other_devices_are_refused(device: str) -> None:
    with pytest.raises(ValidationError):
        EmbeddingSettings(device=device)


def test_token_batches_group_similar_lengths_under_the_budget() -> None:
    lengths = [200, 3, 250, 5, 4, 300, 60, 70]
    batches = token_batches(lengths, max_texts=32, max_tokens=256)
    assert sorted(i for batch in batches for i in batch) == list(range(len(lengths)))
    # 4 texts padded to 60 tokens fit in 256, a fifth at 70 would not; 300 tokens go alone.
    assert batches == [[1, 4, 3, 6], [7], [0], [2], [5]]
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) <= 256


def test_token_batches_cap_the_texts_per_call() -> None:
    batches = token_batches([2] * 10, max_texts=4, max_tokens=10_000)
    assert [len(batch) for batch in batches] == [4, 4, 2]


def test_a_vector_travels_to_the_index_in_nine_decimals_within_float32_precision() -> None:
    rng = np.random.default_rng(7)
    vector = rng.standard_normal(384).astype(np.float32)
    vector /= np.linalg.norm(vector)
    values = indexed_vector(vector)
    assert max(abs(sent - float(kept)) for sent, kept in zip(values, vector, strict=True)) <= 5e-10
    assert max(len(repr(v).lstrip("-")) for v in values) <= len("0.123456789")
    assert len(json.dumps(values)) < 0.7 * len(json.dumps(vector.astype(float).tolist()))
    assert decode_b64(encode_b64(vector)) == values  # what the store stage sends
    as_stored = np.asarray(values, dtype=np.float32)
    assert float(as_stored @ vector) / float(np.linalg.norm(as_stored)) > 1 - 1e-7


@pytest.mark.parametrize("backend", ["onnx", "sentence-transformers"])
def test_an_encoder_asked_for_whole_texts_refuses_one_it_would_cut(backend: str) -> None:
    settings = load_settings().embedding.model_copy(update={"backend": backend})
    model = encoder(settings)
    fits = " ".join(["word"] * (model.max_seq_length - 2))  # with [CLS] and [SEP]: exactly the limit
    over = fits + " more"
    assert model.encode([fits, "short"], whole=True).shape == (2, 384)
    with pytest.raises(TooLong) as refused:
        model.encode(["short", over, fits, over], whole=True)
    assert refused.value.tokens == {1: model.max_seq_length + 1, 3: model.max_seq_length + 1}
    assert refused.value.limit == model.max_seq_length
    assert model.encode([over]).shape == (1, 384)  # a query is cut, not refused

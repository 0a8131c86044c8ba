"""The ONNX Runtime encoder gives the sentence-transformers vectors (same packaged weights)."""

from __future__ import annotations

import numpy as np

from shared.config import load_settings
from shared.embedding import SentenceTransformerEncoder, encoder, model_dir

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

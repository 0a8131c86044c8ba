"""The encoder bench: which setups it measures where, how it compares vectors, and that a setup that
cannot load reports its error instead of hanging the run."""

from __future__ import annotations

import numpy as np
import pytest

from bench.encoders import agreement, agreement_sample, encode_in_processes, report, setups
from shared.config import EmbeddingSettings


def test_the_baseline_comes_first_and_every_gpu_gets_the_torch_backend_at_each_batch_size() -> None:
    found = setups(EmbeddingSettings(), 4, ["cuda:0", "cuda:1"])
    first = found[0].embedding
    assert (first.backend, first.device, found[0].processes) == ("onnx", "cpu", 4)
    assert [s.embedding.model for s in found[:2]] == ["all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8"]
    gpu = [s for s in found if s.embedding.device.startswith("cuda")]
    assert [(s.embedding.device, s.embedding.precision, s.embedding.batch_size) for s in gpu] == [
        (device, precision, batch)
        for device in ("cuda:0", "cuda:1")
        for precision, batch in (("float32", 32), ("float32", 256), ("float16", 256), ("bfloat16", 256))
    ]
    assert {s.embedding.backend for s in gpu} == {"sentence-transformers"}
    assert all(s.processes == 1 for s in gpu)


def test_without_a_gpu_or_an_int8_variant_only_the_cpu_setups_of_that_model_run() -> None:
    found = setups(EmbeddingSettings(model="all-mpnet-base-v2", dimension=768), 2, [])
    assert [(s.embedding.backend, s.embedding.model) for s in found] == [
        ("onnx", "all-mpnet-base-v2"),
        ("sentence-transformers", "all-mpnet-base-v2"),
    ]


def test_agreement_is_the_cosine_of_each_row_with_its_reference() -> None:
    reference = np.eye(3, 4, dtype=np.float32)
    turned = reference.copy()
    turned[1] = np.array([0.0, 0.6, 0.8, 0.0], dtype=np.float32)
    assert agreement(turned, reference) == {"min_cos": 0.6, "mean_cos": pytest.approx(0.866667)}


def test_the_sample_is_even_across_the_texts_and_never_larger_than_asked() -> None:
    texts = [str(n) for n in range(1000)]
    sample = agreement_sample(texts)
    assert len(sample) == 256
    assert sample[:3] == ["0", "3", "6"]
    assert agreement_sample(texts[:10]) == texts[:10]


def test_a_setup_whose_model_cannot_load_raises_its_error_in_the_parent() -> None:
    missing = EmbeddingSettings(model="/nonexistent/model", backend="sentence-transformers")
    with pytest.raises(RuntimeError, match="unknown embedding model"):
        encode_in_processes(missing, ["a text"], 2)


def test_the_report_shows_a_failed_setup_beside_the_measured_ones() -> None:
    row = {
        "name": "onnx fp32, cpu, 2 processes",
        "chunks_per_s": 40.0,
        "ratio_to_baseline": 1.0,
        "cpu_ms_per_chunk": 48.0,
        "agreement_with_baseline": {"min_cos": 1.0, "mean_cos": 1.0},
    }
    results = {
        "stamp": "20261204T000000Z",
        "machine": {"cpus": 2, "processor": "x"},
        "texts": 10,
        "model": "all-MiniLM-L6-v2",
        "setups": [row, {"name": "sentence-transformers float32, cuda:0, batch 32", "error": "CUDA error"}],
    }
    text = report(results)
    assert "| onnx fp32, cpu, 2 processes | 40.0 | 1.0 | 48.0 |  | 1.0 |  |" in text
    assert "| sentence-transformers float32, cuda:0, batch 32 | failed: CUDA error |" in text
    assert "no GPU" in text

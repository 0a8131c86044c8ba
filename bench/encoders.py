"""Encoder throughput by backend and device on the same chunk texts, without the stack.

The pipeline's bench measures the raw model beside the workers on the development machine. This
measures the encoders alone, side by side on one machine, so that a machine with a GPU (which need
not run OpenSearch or Redis) can report the sentence-transformers backend on the GPU against the
CPU setups in the same run:

    python -m bench.encoders texts KB texts.jsonl.gz   # a bench KB's chunk texts (stack up)
    python -m bench.encoders reference texts.jsonl.gz vectors.npy  # the sample's baseline vectors
    python -m bench.encoders run texts.jsonl.gz [--reference vectors.npy]

`run` writes bench/results/<stamp>-encoders.{json,md} (or under --out). Every setup encodes the
same texts after a warm-up; each reports chunks/s, CPU ms a chunk of its processes, and how close
its vectors of an even sample of the texts are to the baseline setup's (the ONNX fp32 encoder, the
default) and, with --reference, to the baseline's vectors saved on another machine (where the
weights came from their package rather than a copy).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import platform
import queue
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from shared.config import REPO_ROOT, EmbeddingSettings, get_settings
from shared.embedding import INT8_MODELS, Vectors, encoder, onnx_model_path

BARRIER_S = 600.0  # the longest a process waits for its siblings to load their models
AGREEMENT_SAMPLE = 256  # texts whose vectors every setup returns for the comparison
# On a GPU: float32 at the default batch and at one that fills a GPU better, then half precision.
GPU_RUNS = (("float32", 32), ("float32", 256), ("float16", 256), ("bfloat16", 256))


@dataclass(frozen=True)
class Setup:
    name: str
    embedding: EmbeddingSettings
    processes: int


def _encode_share(
    embedding: EmbeddingSettings, texts: list[str], sample: list[str], start: Any, out: Any
) -> None:
    try:
        model = encoder(embedding)
        model.encode(texts[:8])  # load and warm up before the clock starts
        start.wait(timeout=BARRIER_S)  # a sibling that died while loading never arrives
        began, cpu = time.time(), time.process_time()
        model.encode(texts)
        ended, cpu = time.time(), time.process_time() - cpu
        peak = None
        if embedding.backend == "sentence-transformers" and embedding.device.startswith("cuda"):
            import torch

            peak = round(torch.cuda.max_memory_allocated(embedding.device) / 2**20, 1)
        out.put((began, ended, cpu, model.encode(sample) if sample else None, peak, None))
    except Exception:  # noqa: BLE001 - reported as the setup's error, the other setups still run
        start.abort()
        out.put((0.0, 0.0, 0.0, None, None, traceback.format_exc(limit=3)))


def _next_span(out: Any, workers: list[Any]) -> tuple[Any, ...]:
    """The next share's figures; a process that died without a word (killed, out of memory) is
    an error, not a wait of an hour."""
    while True:
        try:
            span: tuple[Any, ...] = out.get(timeout=1)
            return span
        except queue.Empty:
            dead = [w.exitcode for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"an encoder process died (exit code {dead[0]})") from None


def encode_in_processes(
    embedding: EmbeddingSettings, texts: list[str], processes: int, sample: list[str] | None = None
) -> dict[str, Any]:
    """Chunks/s of the bare encoder over `texts`, split across `processes` processes started
    together (as a worker's pool is), and CPU ms a chunk of them all; with `sample`, the first
    process's vectors of it under "vectors"."""
    if embedding.backend == "onnx" or embedding.model in INT8_MODELS:
        onnx_model_path(embedding)  # exported once here, not by every process at once
    context = multiprocessing.get_context("spawn")  # a clean interpreter, as a worker process has
    start, out = context.Barrier(processes), context.Queue()
    shares = [texts[i::processes] for i in range(processes)]
    workers = [
        context.Process(target=_encode_share, args=(embedding, share, sample if n == 0 else [], start, out))
        for n, share in enumerate(shares)
    ]
    for worker in workers:
        worker.start()
    try:
        spans = [_next_span(out, workers) for _ in workers]
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()
    errors = [error for *_, error in spans if error]
    if errors:
        raise RuntimeError(errors[0])
    seconds = max(span[1] for span in spans) - min(span[0] for span in spans)
    figures: dict[str, Any] = {
        "processes": processes,
        "chunks": len(texts),
        "seconds": round(seconds, 2),
        "chunks_per_s": round(len(texts) / seconds, 2),
        # What the encoder costs the CPU, whoever else runs: the pipeline's own overhead is the
        # worker's CPU a chunk beyond this.
        "cpu_ms_per_chunk": round(sum(span[2] for span in spans) / len(texts) * 1000, 2),
    }
    peaks = [span[4] for span in spans if span[4] is not None]
    if peaks:
        figures["gpu_peak_mib"] = max(peaks)
    vectors = next((span[3] for span in spans if span[3] is not None), None)
    if vectors is not None:
        figures["vectors"] = vectors
    return figures


def setups(base: EmbeddingSettings, processes: int, gpus: list[str]) -> list[Setup]:
    """The baseline (ONNX fp32 in `processes` processes, as the workers run it) first."""
    onnx = base.model_copy(update={"backend": "onnx", "device": "cpu"})
    torch_cpu = base.model_copy(update={"backend": "sentence-transformers", "device": "cpu"})
    found = [Setup(f"onnx float32, cpu, {processes} processes", onnx, processes)]
    if f"{base.model}-int8" in INT8_MODELS:
        int8 = onnx.model_copy(update={"model": f"{base.model}-int8"})
        found.append(Setup(f"onnx int8, cpu, {processes} processes", int8, processes))
    found.append(Setup("sentence-transformers float32, cpu, 1 process", torch_cpu, 1))
    for gpu in gpus:
        for precision, batch in GPU_RUNS:
            found.append(
                Setup(
                    f"sentence-transformers {precision}, {gpu}, batch {batch}",
                    torch_cpu.model_copy(update={"device": gpu, "batch_size": batch, "precision": precision}),
                    1,
                )
            )
    return found


def cuda_devices() -> list[str]:
    try:
        import torch
    except ImportError:
        return []
    return [f"cuda:{n}" for n in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def agreement(vectors: Vectors, reference: Vectors) -> dict[str, float]:
    """Cosine of each text's vector with its reference vector (both are L2-normalized)."""
    cosines = np.sum(vectors.astype(np.float64) * reference.astype(np.float64), axis=1)
    return {"min_cos": round(float(cosines.min()), 6), "mean_cos": round(float(cosines.mean()), 6)}


def machine() -> dict[str, Any]:
    found: dict[str, Any] = {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line
        ]
        found["processor"] = names[0] if names else found["processor"]
    try:
        import torch

        if torch.cuda.is_available():
            found["gpus"] = [torch.cuda.get_device_name(n) for n in range(torch.cuda.device_count())]
            found["torch"] = torch.__version__
    except ImportError:
        pass
    return found


def agreement_sample(texts: list[str]) -> list[str]:
    return texts[:: max(1, len(texts) // AGREEMENT_SAMPLE)][:AGREEMENT_SAMPLE]


def baseline_vectors(texts: list[str], base: EmbeddingSettings) -> Vectors:
    """The baseline encoder's vectors of the agreement sample, in this process."""
    return encoder(setups(base, 1, [])[0].embedding).encode(agreement_sample(texts))


def measure(
    texts: list[str], base: EmbeddingSettings, processes: int, reference: Vectors | None
) -> dict[str, Any]:
    sample = agreement_sample(texts)
    results: dict[str, Any] = {
        "stamp": datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"),
        "machine": machine(),
        "texts": len(texts),
        "model": base.model,
        "setups": [],
    }
    baseline: dict[str, Any] | None = None
    for setup in setups(base, processes, cuda_devices()):
        print(f"encoders: {setup.name}", flush=True)
        row: dict[str, Any] = {
            "name": setup.name,
            **setup.embedding.model_dump(include={"model", "backend", "device", "precision", "batch_size"}),
        }
        try:
            figures = encode_in_processes(setup.embedding, texts, setup.processes, sample)
        except Exception as error:  # noqa: BLE001 - one setup failing still reports the others
            row["error"] = str(error).strip().splitlines()[-1]
            results["setups"].append(row)
            print(f"encoders: {setup.name} failed: {row['error']}", flush=True)
            continue
        vectors = figures.pop("vectors")
        row |= figures
        if baseline is None:
            baseline = {"chunks_per_s": figures["chunks_per_s"], "vectors": vectors}
        row["ratio_to_baseline"] = round(figures["chunks_per_s"] / baseline["chunks_per_s"], 3)
        row["agreement_with_baseline"] = agreement(vectors, baseline["vectors"])
        if reference is not None:
            row["agreement_with_reference"] = agreement(vectors, reference[: len(vectors)])
        results["setups"].append(row)
        print(f"encoders: {setup.name}: {figures['chunks_per_s']} chunks/s", flush=True)
    return results


def report(results: dict[str, Any]) -> str:
    found = results["machine"]
    lines = [
        f"# Encoders, run {results['stamp']}",
        "",
        f"{results['texts']} chunk texts, model {results['model']}; "
        f"{found['cpus']} CPUs ({found['processor']}), "
        + (f"GPU {', '.join(found['gpus'])}" if found.get("gpus") else "no GPU"),
        "",
        "| setup | chunks/s | × baseline | CPU ms a chunk | GPU peak MiB "
        "| min cos to baseline | min cos to reference |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["setups"]:
        if "error" in row:
            lines.append(f"| {row['name']} | failed: {row['error']} | | | | | |")
            continue
        ref = row.get("agreement_with_reference", {}).get("min_cos", "")
        base = row["agreement_with_baseline"]["min_cos"]
        lines.append(
            f"| {row['name']} | {row['chunks_per_s']} | {row['ratio_to_baseline']} "
            f"| {row['cpu_ms_per_chunk']} | {row.get('gpu_peak_mib', '')} | {base} | {ref} |"
        )
    return "\n".join(lines) + "\n"


def save_texts(kb: str, path: Path) -> int:
    from shared.search import chunk_index
    from shared.wiring import build_services

    settings = get_settings()
    texts = chunk_index.kb_chunk_texts(build_services(settings).client, settings, kb)
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.writelines(json.dumps(text) + "\n" for text in texts)
    return len(texts)


def load_texts(path: Path) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.encoders", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    texts_cmd = commands.add_parser("texts", help="Save a KB's chunk texts (the stack must be up).")
    texts_cmd.add_argument("kb")
    texts_cmd.add_argument("file", type=Path)
    reference_cmd = commands.add_parser("reference", help="Save the baseline's vectors of the sample.")
    reference_cmd.add_argument("file", type=Path)
    reference_cmd.add_argument("vectors", type=Path)
    run_cmd = commands.add_parser("run", help="Measure every setup on the saved texts.")
    run_cmd.add_argument("file", type=Path)
    run_cmd.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    run_cmd.add_argument("--reference", type=Path, help="Vectors of the sample saved on another machine.")
    run_cmd.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results")
    args = parser.parse_args(argv)
    if args.command == "texts":
        print(f"encoders: saved {save_texts(args.kb, args.file)} chunk texts to {args.file}")
        return 0
    if args.command == "reference":
        np.save(args.vectors, baseline_vectors(load_texts(args.file), get_settings().embedding))
        print(f"encoders: saved the baseline's vectors of the sample to {args.vectors}")
        return 0
    reference = np.load(args.reference) if args.reference else None
    results = measure(load_texts(args.file), get_settings().embedding, args.processes, reference)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{results['stamp']}-encoders.json"
    path.write_text(json.dumps(results, indent=2))
    path.with_suffix(".md").write_text(report(results))
    print(report(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Baselines measured in the bench's own run: the raw model in N processes, and a worker of N processes.

The raw model runs the same encoder class with the same settings as the workers (batch encode,
no queue, no OpenSearch), in as many processes as the worker has, all started together: the
pipeline's ratio then compares like with like on the same cores.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import time
from typing import Any

import redis

from shared.config import REPO_ROOT, Settings
from shared.embedding import encoder, for_model

STACK = REPO_ROOT / "deploy" / "local" / "stack.sh"
EMBED_CACHE = "ragline:emb:*"


def _encode_share(settings: Settings, model_name: str, texts: list[str], start: Any, out: Any) -> None:
    model = encoder(for_model(settings.embedding, model_name))
    model.encode(texts[:8])  # load and warm up before the clock starts
    start.wait()
    began, cpu = time.time(), time.process_time()
    model.encode(texts)
    out.put((began, time.time(), time.process_time() - cpu))


def raw_model(
    settings: Settings, texts: list[str], processes: int, model: str | None = None
) -> dict[str, float]:
    """Chunks/s of the bare encoder of `model` (default: the configured one) over `texts`, split
    across `processes` processes started together."""
    context = multiprocessing.get_context("spawn")  # a clean interpreter, as a worker process has
    start, out = context.Barrier(processes), context.Queue()
    shares = [texts[i::processes] for i in range(processes)]
    name = model or settings.embedding.model
    workers = [context.Process(target=_encode_share, args=(settings, name, s, start, out)) for s in shares]
    for worker in workers:
        worker.start()
    spans = [out.get(timeout=3600) for _ in workers]
    for worker in workers:
        worker.join()
    seconds = max(end for _, end, _ in spans) - min(began for began, _, _ in spans)
    return {
        "processes": processes,
        "chunks": len(texts),
        "seconds": round(seconds, 2),
        "chunks_per_s": round(len(texts) / seconds, 2),
        # What the model costs the CPU, whoever else runs: the pipeline's own overhead is the
        # worker's CPU a chunk beyond this.
        "cpu_ms_per_chunk": round(sum(cpu for _, _, cpu in spans) / len(texts) * 1000, 2),
    }


def restart_worker(
    settings: Settings,
    concurrency: int,
    timeout_s: float = 300.0,
    env: dict[str, str] | None = None,
    hosts: int = 1,
) -> None:
    """The local stack's worker again, with `concurrency` processes and `env` on top of its
    configuration; with `hosts` > 1, that many workers of `concurrency` processes each, as worker
    hosts would be: each its own Celery node in a process group of its own (deploy/local/worker.sh),
    with its own log, serving the same queues.

    Returns once every pool process has loaded its models: Celery reports ready before that, and
    a load started at once would count the loading as the first quarter's memory and time.
    """
    names = ["worker", *(f"worker-host{n}" for n in range(2, hosts + 1))]
    started = {**os.environ, **(env or {}), "RAGLINE_CELERY__WORKER_CONCURRENCY": str(concurrency)}
    if hosts > 1:
        started["RAGLINE_WORKERS"] = " ".join(names)
    for action in ("down", "up"):  # down stops every worker*.pid, a simulated host's too
        subprocess.run(["bash", str(STACK), action, "worker"], check=True, env=started, capture_output=True)
    logs = [settings.state_dir / "logs" / f"{name}.log" for name in names]  # emptied by each start
    deadline = time.monotonic() + timeout_s
    while any(log.read_text(errors="replace").count("workers.warmup") < concurrency for log in logs):
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: the workers' pool processes did not warm up; see {logs}")
        time.sleep(0.5)


def forget_embeddings(settings: Settings) -> int:
    """Empty the embedding cache, so that every ingest run embeds its chunks for real."""
    client = redis.Redis.from_url(settings.redis.url)
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=EMBED_CACHE, count=1000):
        batch.append(key)
        if len(batch) == 1000:
            removed += int(client.delete(*batch))
            batch = []
    if batch:
        removed += int(client.delete(*batch))
    client.close()
    return removed

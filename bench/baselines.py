"""Baselines measured in the bench's own run: the raw model in N processes, and a worker of N processes.

The raw model runs the same encoder class with the same settings as the workers (batch encode,
no queue, no OpenSearch), in as many processes as the worker has, all started together: the
pipeline's ratio then compares like with like on the same cores.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

import redis

from bench.encoders import encode_in_processes
from shared.config import REPO_ROOT, Settings
from shared.embedding import for_model

STACK = REPO_ROOT / "deploy" / "local" / "stack.sh"
EMBED_CACHE = "ragline:emb:*"


@dataclass(frozen=True)
class Sample:
    """The texts of one slice of the raw model's baseline, and the chunks the part of the load it
    stands for added (its weight)."""

    texts: list[str]
    part_chunks: int


def raw_model(
    settings: Settings, texts: list[str], processes: int, model: str | None = None
) -> dict[str, float]:
    """Chunks/s of the bare encoder of `model` (default: the configured one) over `texts`, split
    across `processes` processes started together."""
    embedding = for_model(settings.embedding, model or settings.embedding.model)
    figures: dict[str, float] = encode_in_processes(embedding, texts, processes)
    return figures


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
        command = ["bash", str(STACK), action, "worker"]
        done = subprocess.run(command, check=False, env=started, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"bench: `stack.sh {action} worker` failed:\n{done.stdout}{done.stderr}")
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

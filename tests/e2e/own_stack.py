"""A worker and an API of a test's own, on the stack's OpenSearch and Redis, with settings of its own.

The stack's worker runs with the deployment's settings; a test that needs others (a fetch
allowlist, short limits) starts this pair instead. They get a Redis database, an index prefix and
a state dir of their own, so nothing they queue or store meets the stack's worker, and both are
removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis

from shared.config import Settings
from shared.search.client import build_client
from tests.e2e.helpers import RAGLINE, Server, bound_to_test, start_server, stop_server


@dataclass
class OwnStack:
    server: Server
    worker_log: Path
    tmp: Path
    env: dict[str, str]
    worker: subprocess.Popen[bytes]

    def kill_worker(self) -> None:
        """SIGKILL the worker and its pool, as a crashed host would: no cleanup runs."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait(timeout=60)

    def start_worker(self) -> None:
        """A new worker with the same settings (after `kill_worker`)."""
        self.worker = _start_worker(self.tmp, self.env)

    @contextlib.contextmanager
    def another_worker(self) -> Iterator[Path]:
        """A second worker with the same settings, as another host would run it; yields its log."""
        tmp = self.tmp / f"worker-{uuid.uuid4().hex[:6]}"
        tmp.mkdir()
        process = _start_worker(tmp, self.env)
        try:
            yield tmp / "worker.log"
        finally:
            _stop_worker(process)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_worker(tmp: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    port = _port()
    log = tmp / "worker.log"
    with log.open("a") as out:  # a restarted worker's log follows its killed predecessor's
        process = subprocess.Popen(
            bound_to_test([RAGLINE, "worker", "--name", f"own-{uuid.uuid4().hex[:6]}", "--concurrency", "1"]),
            env={**os.environ, **env, "RAGLINE_METRICS__WORKER_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool processes share its group, stopped together below
        )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the metrics endpoint opens once the worker is ready
        if process.poll() is not None:
            pytest.fail(f"the worker exited during startup:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"the worker did not get ready:\n{log.read_text()[-3000:]}")


def _stop_worker(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def own_stack(tmp: Path, settings: Settings, redis_db: int, env: dict[str, str]) -> Iterator[OwnStack]:
    """A worker and an API with `env` on top of the isolation; `redis_db` is the test's own."""
    prefix = f"own{uuid.uuid4().hex[:8]}"
    url = urlsplit(settings.redis.url)
    isolated = {
        "RAGLINE_STATE_DIR": str(tmp / "state"),
        "RAGLINE_REDIS__URL": urlunsplit(url._replace(path=f"/{redis_db}")),
        "RAGLINE_OPENSEARCH__INDEX_PREFIX": prefix,
        **env,
    }
    worker = _start_worker(tmp, isolated)
    try:
        server, api = start_server(tmp, isolated)
    except BaseException:
        _stop_worker(worker)
        raise
    own = OwnStack(server, tmp / "worker.log", tmp, isolated, worker)
    try:
        yield own
    finally:
        stop_server(api)
        _stop_worker(own.worker)
        build_client(settings.opensearch).indices.delete(index=f"{prefix}*", expand_wildcards="all")
        database = redis.Redis.from_url(isolated["RAGLINE_REDIS__URL"])
        database.flushdb()
        database.close()

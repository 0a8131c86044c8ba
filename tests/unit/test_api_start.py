"""`api.sh start` fails as soon as the API exits while starting (a refused configuration): it waited
out its 120 s before, then blamed health."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_api_refusing_its_configuration_fails_the_start_at_once(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    env = {
        **clean,
        "RAGLINE_STATE_DIR": str(tmp_path / "state"),
        "RAGLINE_API__PORT": str(_free_port()),
        "RAGLINE_CELERY__WORKER_CONCURRENCY": "many",  # not a number: the settings refuse it
    }
    started = subprocess.run(
        ["bash", str(REPO / "deploy/local/api.sh"), "start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,  # under the script's own 120 s: waiting those out is the failure
        check=False,
    )
    assert started.returncode != 0
    assert "api exited while starting" in started.stderr, started.stderr
    assert "RAGLINE_CELERY__WORKER_CONCURRENCY" in started.stderr  # the log tail names the setting
    assert not (tmp_path / "state" / "api.pid").exists()

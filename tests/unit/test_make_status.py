"""`make status` with the stack stopped reports each service stopped and exits 0: make printed
"Error 3" after the report, which read as a broken install. The script itself still exits 3."""

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


def _stopped_stack_env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    ports = {
        name: str(_free_port())
        for name in ("RAGLINE_OPENSEARCH_PORT", "RAGLINE_REDIS_PORT", "RAGLINE_S3_PORT", "RAGLINE_API__PORT")
    }
    return {**clean, **ports, "RAGLINE_STATE_DIR": str(tmp_path / "state")}


def test_make_status_reports_a_stopped_stack_without_failing(tmp_path: Path) -> None:
    env = _stopped_stack_env(tmp_path)
    made = subprocess.run(
        ["make", "-s", "-C", str(REPO), "status"], env=env, capture_output=True, text=True, check=False
    )
    assert made.returncode == 0, made.stderr
    assert "opensearch: stopped" in made.stdout
    assert "api: stopped" in made.stdout
    assert "Error" not in made.stderr
    script = subprocess.run(
        ["bash", str(REPO / "deploy/local/stack.sh"), "status"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert script.returncode == 3  # what scripts that ask whether the stack is up read

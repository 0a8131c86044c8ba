"""The bench is a tool of its own: `python -m bench`, with its options, outside the `ragline` CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_python_m_bench_lists_its_options() -> None:
    done = _bench("--help", env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert "--quick" in done.stdout
    assert "{ingest,sources}" in done.stdout


def test_without_a_key_the_bench_refuses_before_it_measures(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    env["RAGLINE_STATE_DIR"] = str(tmp_path)  # no local development key there
    done = _bench(env=env)
    assert done.returncode == 2
    assert done.stderr.startswith("AUTH_ERROR:")


def test_the_cli_no_longer_runs_the_bench() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert " bench " not in done.stdout

"""A local stack moved to other ports: the services its scripts start use its servers, not
whatever still answers on the default ports (another stack's, perhaps)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def urls(tmp_path: Path, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    script = "source deploy/local/lib.sh; " + "; ".join(
        f'echo "${{{name}:-default}}"' for name in ("RAGLINE_OPENSEARCH__URL", "RAGLINE_REDIS__URL")
    )
    done = subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env={**clean, "RAGLINE_STATE_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.split()


def test_a_moved_server_is_the_one_the_services_use(tmp_path: Path) -> None:
    moved = urls(tmp_path, RAGLINE_OPENSEARCH_PORT="9240", RAGLINE_REDIS_PORT="6419")
    assert moved == ["http://127.0.0.1:9240", "redis://127.0.0.1:6419/0"]


def test_a_url_given_outright_wins_and_the_defaults_stay_the_services_own(tmp_path: Path) -> None:
    given = urls(
        tmp_path, RAGLINE_OPENSEARCH_PORT="9240", RAGLINE_OPENSEARCH__URL="https://search.internal:443"
    )
    assert given == ["https://search.internal:443", "default"]
    assert urls(tmp_path) == ["default", "default"]


def test_the_bench_reaches_a_moved_stack(tmp_path: Path) -> None:
    """`make bench` ran the bench with the default URLs: on a moved stack it emptied the embedding
    cache of whatever Redis answered on 6379 (or failed there), and loaded another stack's OpenSearch."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_")}
    env = {
        **clean,
        "RAGLINE_STATE_DIR": str(tmp_path),
        "RAGLINE_OPENSEARCH_PORT": "9240",
        "RAGLINE_REDIS_PORT": "6419",
    }
    show = 'show: ; @$(STACK_ENV) echo "$$RAGLINE_OPENSEARCH__URL $$RAGLINE_REDIS__URL"'
    shown = subprocess.run(
        ["make", "-s", "--eval", show, "show"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert shown.stdout.split() == ["http://127.0.0.1:9240", "redis://127.0.0.1:6419/0"]
    planned = subprocess.run(
        ["make", "-n", "bench", "bench-quick"], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    runs = [line for line in planned.stdout.splitlines() if "-m bench" in line]
    assert len(runs) == 2
    assert all(line.startswith("source deploy/local/lib.sh && ") for line in runs), runs

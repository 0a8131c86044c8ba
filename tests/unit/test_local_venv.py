"""The local scripts and the Makefile run their own checkout's code, even from a virtual
environment another checkout made (RAGLINE_VENV): its editable install points at that checkout,
whose code (and, through `ragline up`, whose scripts) would otherwise be the ones that run."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHOW_SHARED = "import shared; print(shared.__file__)"


@pytest.fixture
def others_venv(tmp_path: Path) -> Path:
    """A venv holding what an editable install of another checkout leaves in it."""
    other = tmp_path / "other-checkout"
    (other / "shared").mkdir(parents=True)
    (other / "shared" / "__init__.py").write_text("")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    Path(purelib, "__editable__.ragline.pth").write_text(f"{other}\n")
    return venv


def _run(command: list[str], tmp_path: Path, venv: Path) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_") and k != "PYTHONPATH"}
    ran = subprocess.run(
        command,
        cwd=tmp_path,  # as a service started from anywhere: not the checkout's folder on its path
        env={**clean, "RAGLINE_STATE_DIR": str(tmp_path / "state"), "RAGLINE_VENV": str(venv)},
        capture_output=True,
        text=True,
        check=True,
    )
    return ran.stdout.strip()


def test_the_scripts_run_this_checkouts_code(tmp_path: Path, others_venv: Path) -> None:
    shown = _run(
        # -u as the scripts run (set -euo pipefail): PYTHONPATH is not set here.
        ["bash", "-euc", f'source {REPO}/deploy/local/lib.sh; "$VENV/bin/python" -c "{SHOW_SHARED}"'],
        tmp_path,
        others_venv,
    )
    assert Path(shown) == REPO / "shared" / "__init__.py"


def test_the_makefile_runs_this_checkouts_code(tmp_path: Path, others_venv: Path) -> None:
    # What `make up` and `make bench` do: run the venv's Python (its `ragline`, `-m bench`).
    show = f"show: ; @cd / && $(VENV)/bin/python -c '{SHOW_SHARED}'"
    shown = _run(["make", "-s", "-C", str(REPO), "--eval", show, "show"], tmp_path, others_venv)
    assert Path(shown) == REPO / "shared" / "__init__.py"

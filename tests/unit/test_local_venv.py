"""The local scripts run their own checkout's code, even from a virtual environment another
checkout made (RAGLINE_VENV): its editable install points at that checkout, whose code would
otherwise be the one the services run."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHOW_SHARED = "import shared; print(shared.__file__)"


def test_a_venv_of_another_checkout_runs_this_checkouts_code(tmp_path: Path) -> None:
    other = tmp_path / "other-checkout"
    (other / "shared").mkdir(parents=True)
    (other / "shared" / "__init__.py").write_text("")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    # What an editable install of the other checkout leaves in its environment.
    Path(purelib, "__editable__.ragline.pth").write_text(f"{other}\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAGLINE_") and k != "PYTHONPATH"}
    ran = subprocess.run(
        ["bash", "-c", f'source {REPO}/deploy/local/lib.sh; "$VENV/bin/python" -c "{SHOW_SHARED}"'],
        cwd=tmp_path,  # as a service started from anywhere: not the checkout's folder on its path
        env={**clean, "RAGLINE_STATE_DIR": str(tmp_path / "state"), "RAGLINE_VENV": str(venv)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(ran.stdout.strip()) == REPO / "shared" / "__init__.py"

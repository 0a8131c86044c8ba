"""The client install: the wheel without the `server` extra, in a fresh venv, drives a real API.

It carries the CLI's remote commands and their dependencies only: no Celery, OpenSearch client,
parsers or models, and it stays under 100 MB. Server commands refuse with a clear message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import anyio
import pytest

from shared.config import REPO_ROOT
from tests.e2e.helpers import Server
from tests.e2e.test_mcp_proxy import check_the_proxy_serves_the_remote_tools

pytestmark = pytest.mark.e2e

SERVER_ONLY = (
    "torch",
    "celery",
    "opensearch-py",
    "unstructured",
    "sentence-transformers",
    "presidio-analyzer",
)
MAX_INSTALL_BYTES = 100 * 10**6


def _outside_the_checkout() -> dict[str, str]:
    """This environment without the checkout on PYTHONPATH (the local scripts put it there): pip
    would take its ragline.egg-info for an installed ragline and leave the venv without it, and
    the client install would run the checkout's code."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(*argv: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=_outside_the_checkout() if env is None else env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def light(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the ragline wheel without extras (its dependencies from the package index)."""
    root = tmp_path_factory.mktemp("light")
    wheels = root / "wheels"
    _run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(wheels),
        str(REPO_ROOT),
    )
    (wheel,) = wheels.glob("ragline-*.whl")
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", str(venv))
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    _run(*pip, "-c", str(REPO_ROOT / "constraints.txt"), str(wheel))
    return venv


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def test_the_client_install_is_small_and_has_no_server_parts(light: Path) -> None:
    listed = json.loads(_run(str(light / "bin" / "python"), "-m", "pip", "list", "--format=json"))
    names = {p["name"].lower() for p in listed}
    assert "ragline" in names
    assert not names & set(SERVER_ONLY), sorted(names & set(SERVER_ONLY))
    assert _size(light) < MAX_INSTALL_BYTES, _size(light)


def test_a_server_command_says_which_extra_it_needs(light: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(light / "bin" / "ragline"), "serve"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=_outside_the_checkout(),
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "ragline[server]" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


def test_the_remote_commands_work_from_the_client_install(
    light: Path, server: Server, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "RAGLINE_SERVER": server.url,
        "RAGLINE_API_KEY": server.keys["a_admin"],
    }
    ragline = str(light / "bin" / "ragline")
    kb = f"light-{uuid.uuid4().hex[:6]}"
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "terns.md").write_text("# Terns\n\nArctic terns migrate from pole to pole every year.\n")
    (folder / "eels.txt").write_text("Sand eels bury themselves in the seabed at night.\n")

    def cli(*args: str) -> str:
        return _run(ragline, *args, env=env, cwd=tmp_path)

    assert json.loads(cli("kb", "create", kb))["kb_id"] == kb
    report = json.loads(cli("ingest", str(folder), "--kb", kb, "--json"))
    assert report["outcomes"] == {"created": 2}, report
    assert report["statuses"] == {"ready": 2}, report
    status = json.loads(cli("doc", "status", "--kb", kb, "terns.md"))
    assert status["status"] == "ready", status
    listed = json.loads(cli("doc", "list", "--kb", kb, "--json"))
    assert sorted(d["doc_id"] for d in listed["documents"]) == ["eels.txt", "terns.md"]
    hits = json.loads(cli("search", "which bird migrates between the poles", "--kb", kb, "--json"))
    assert hits["results"][0]["doc_id"] == "terns.md", hits
    batch = json.loads(cli("batch", "status", report["batch_id"]))
    assert batch["total"] == 2, batch
    assert kb in cli("kb", "list", "--json")


def test_the_mcp_proxy_runs_from_the_client_install(light: Path, server: Server) -> None:
    anyio.run(check_the_proxy_serves_the_remote_tools, server, str(light / "bin" / "ragline"))

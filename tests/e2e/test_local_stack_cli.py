"""The user's commands for the local stack: `ragline status` and a repeated `ragline up`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shared.config import Settings

pytestmark = pytest.mark.e2e

RAGLINE = str(Path(sys.executable).parent / "ragline")
SERVICES = ("opensearch", "redis", "s3", "worker", "api")


def _ragline(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([RAGLINE, *args], capture_output=True, text=True, timeout=300, check=False)


def _pids(settings: Settings) -> dict[str, str]:
    files = {
        "opensearch": settings.state_dir / "opensearch" / "opensearch.pid",
        "redis": settings.state_dir / "redis" / "redis.pid",
        "s3": settings.state_dir / "s3" / "s3proxy.pid",
        "worker": settings.state_dir / "worker.pid",
        "api": settings.state_dir / "api.pid",
    }
    return {name: path.read_text().strip() for name, path in files.items()}


def test_status_reports_every_service_and_where_it_listens(settings: Settings) -> None:
    result = _ragline("status")
    assert result.returncode == 0, result.stdout + result.stderr
    for service in SERVICES:
        assert f"{service}: running" in result.stdout
    assert settings.opensearch.url in result.stdout
    assert settings.redis.url.rsplit("/", 1)[0] in result.stdout


def test_up_again_is_harmless(settings: Settings) -> None:
    before = _pids(settings)
    result = _ragline("up")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("already running") == len(SERVICES)
    assert _pids(settings) == before

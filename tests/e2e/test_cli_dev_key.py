"""The CLI's development key, read from the state dir, names where it came from when the API
refuses it: a stack started with another state dir (another checkout's) wrote its key elsewhere,
and "the API key is not valid" alone left a user who never gave a key guessing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.e2e.helpers import Server, run_cli

pytestmark = pytest.mark.e2e


def test_a_refused_development_key_names_its_file(server: Server, tmp_path: Path) -> None:
    keys = tmp_path / "api-keys.json"
    keys.write_text(
        json.dumps([{"name": "local development", "key": "rl_dev_not_this_stacks", "tenant": "t"}])
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RAGLINE_API_KEY", "RAGLINE_SERVER")}
    env |= {"RAGLINE_STATE_DIR": str(tmp_path), "RAGLINE_API__PORT": str(urlsplit(server.url).port)}
    result = run_cli(["kb", "list"], env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("AUTH_ERROR"), result.stderr
    assert str(keys) in result.stderr
    assert "RAGLINE_STATE_DIR" in result.stderr
    assert "rl_dev_not_this_stacks" not in result.stderr


def test_no_key_at_all_names_the_file_it_looked_in(server: Server, tmp_path: Path) -> None:
    """The stack's own CLI in a shell whose RAGLINE_STATE_DIR is not the stack's: no development
    key there, and the refusal did not say where it had looked."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAGLINE_API_KEY", "RAGLINE_SERVER")}
    env |= {"RAGLINE_STATE_DIR": str(tmp_path), "RAGLINE_API__PORT": str(urlsplit(server.url).port)}
    result = run_cli(["kb", "list"], env)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("AUTH_ERROR"), result.stderr
    assert f"no development key in {tmp_path / 'api-keys.json'}" in result.stderr
    assert "RAGLINE_STATE_DIR" in result.stderr

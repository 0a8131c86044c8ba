"""The CLI's addressing and key choice: ids stay one path segment, the dev key stays local."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
from typer.testing import CliRunner

from client.http import api_path, default_key
from services.cli.main import app
from shared.config import REPO_ROOT, Settings, load_settings

DEV = "rl_dev_0123456789abcdef0123"
KEYS = [
    {"key": "tenant-a-reader-0123456789", "tenant": "default", "role": "read", "name": "reader"},
    {"key": DEV, "tenant": "default", "role": "admin", "name": "local development"},
    {"key": "tenant-b-admin-0123456789", "tenant": "other", "role": "admin", "name": "b"},
]
HOSTILE_IDS = [
    "x/../..",
    "..",
    ".",
    "a?b=1",
    "a#frag",
    "100%",
    "with space",
    "dir/sub/file.md",
    "%2F",
    "a/./b",
]


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.delenv("RAGLINE_API_KEY", raising=False)
    monkeypatch.delenv("RAGLINE_SERVER", raising=False)
    monkeypatch.delenv("RAGLINE_API__PORT", raising=False)  # a shell of a stack on moved ports
    (tmp_path / "api-keys.json").write_text(json.dumps(KEYS))
    return load_settings(state_dir=tmp_path)


@pytest.mark.parametrize("doc_id", HOSTILE_IDS)
def test_an_id_stays_one_segment_of_its_url(doc_id: str) -> None:
    request = httpx.Client(base_url="http://127.0.0.1:8000").build_request(
        "DELETE", api_path("kbs", "K", "documents", doc_id)
    )
    raw = request.url.raw_path.decode()
    prefix = "/v1/kbs/K/documents/"
    assert raw.startswith(prefix), raw  # no dot segment resolved the path up to the KB
    assert "?" not in raw
    assert "#" not in raw
    assert unquote(raw[len(prefix) :]) == doc_id  # what the server's {doc_id:path} receives


def test_plain_ids_read_as_they_are() -> None:
    assert api_path("kbs", "docs", "documents", "guide/setup.md") == "/v1/kbs/docs/documents/guide%2Fsetup.md"
    assert api_path("search") == "/v1/search"


@pytest.mark.parametrize("server", ["http://127.0.0.1:8000", "http://localhost:8000/", "http://[::1]:8000"])
def test_the_local_stack_gets_the_development_key_found_by_its_name(settings: Settings, server: str) -> None:
    assert default_key(settings, server) == DEV


@pytest.mark.parametrize(
    "server",
    [
        "https://ragline.example.com",
        "http://ragline.example.com:8000",
        "http://127.0.0.1:9000",  # another port: not the local stack's API
        "https://127.0.0.1:8000",
        "http://10.0.0.5:8000",
    ],
)
def test_no_other_server_gets_the_development_key(settings: Settings, server: str) -> None:
    assert default_key(settings, server) is None


def test_an_explicit_key_goes_where_it_is_sent(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        default_key(settings, "https://ragline.example.com", "given-key-0123456789") == "given-key-0123456789"
    )
    monkeypatch.setenv("RAGLINE_API_KEY", "env-key-0123456789")
    assert default_key(settings, "https://ragline.example.com") == "env-key-0123456789"


def test_without_a_named_development_key_none_is_sent(settings: Settings) -> None:
    (settings.state_dir / "api-keys.json").write_text(json.dumps([KEYS[0], KEYS[2]]))
    assert default_key(settings, "http://127.0.0.1:8000") is None


def _api_sh_dev_key(state_dir: Path) -> str:
    env = {**os.environ, "RAGLINE_STATE_DIR": str(state_dir)}
    script = REPO_ROOT / "deploy" / "local" / "api.sh"
    return subprocess.run(
        ["bash", str(script), "dev_key"], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout


@pytest.mark.parametrize("indent", [None, 2])
def test_make_up_prints_the_development_key_and_no_other(tmp_path: Path, indent: int | None) -> None:
    """One line (json.dumps) or pretty-printed, the dev key neither first nor last."""
    (tmp_path / "api-keys.json").write_text(json.dumps(KEYS, indent=indent))
    out = _api_sh_dev_key(tmp_path)
    assert f"development key: {DEV}" in out
    assert all(k["key"] not in out for k in KEYS if k["key"] != DEV)


def test_make_up_prints_no_key_when_none_is_the_development_key(tmp_path: Path) -> None:
    (tmp_path / "api-keys.json").write_text(json.dumps([KEYS[0], KEYS[2]]))
    out = _api_sh_dev_key(tmp_path)
    assert "no key named 'local development'" in out
    assert all(k["key"] not in out for k in KEYS)


@pytest.mark.parametrize("command", [["doc", "delete", "--kb", "K", "x/../.."], ["kb", "delete", "K"]])
def test_deletes_without_a_terminal_refuse_without_yes(command: list[str]) -> None:
    # Port 1: if the command sent anything it would fail UNAVAILABLE (exit 1), not refuse (exit 2).
    result = CliRunner().invoke(app, [*command, "--server", "http://127.0.0.1:1"])
    assert result.exit_code == 2, result.output
    assert "--yes" in result.output
    assert "UNAVAILABLE" not in result.output

"""Every `ragline` command answers --help."""

from __future__ import annotations

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from services.cli.main import app
from shared.config import get_settings

COMMANDS = sorted(get_command(app).commands)  # type: ignore[attr-defined]


def test_the_command_lists_its_subcommands() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in COMMANDS:
        assert name in result.output


@pytest.mark.parametrize("name", COMMANDS)
def test_each_subcommand_has_help(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output


def test_bad_configuration_exits_with_the_message(monkeypatch: pytest.MonkeyPatch) -> None:
    get_settings.cache_clear()
    monkeypatch.setenv("RAGLINE_REDIS__URL", "http://not-redis")
    result = CliRunner().invoke(app, ["config"])
    get_settings.cache_clear()
    assert result.exit_code == 2
    assert "RAGLINE_REDIS__URL" in result.output

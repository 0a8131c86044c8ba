"""A stack that is down, as a newcomer meets it: one line that names what is unreachable.

Daily commands end at once with that line; a bulk load keeps retrying, saying so; `ragline mcp`
starts anyway and answers each tool call UNAVAILABLE. Nothing listens on port 1 of loopback.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.e2e.helpers import RAGLINE

pytestmark = pytest.mark.e2e

NOWHERE = "http://127.0.0.1:1"
BOUND_S = 60  # a bound on the run, not a measurement: the old commands retried for about a minute


def _env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAGLINE_SERVER", "RAGLINE_API_KEY")}
    return env | overrides


def _ragline(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAGLINE, *args], env=_env(**env), capture_output=True, text=True, timeout=BOUND_S, check=False
    )


@pytest.mark.parametrize("command", [["kb", "list"], ["search", "foo"], ["doc", "status", "--kb", "k", "d"]])
def test_a_daily_command_against_no_server_fails_with_one_line(command: list[str]) -> None:
    result = _ragline([*command, "--server", NOWHERE])
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"UNAVAILABLE: cannot reach the Ragline API at {NOWHERE}"), line
    assert "RAGLINE_SERVER" in line
    print(f"{' '.join(command)}: {line}")


def test_the_local_stack_down_says_how_to_start_it() -> None:
    result = _ragline(["kb", "list"], RAGLINE_API__PORT="1")  # the local stack's API, on a dead port
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "UNAVAILABLE" in line
    assert "make up" in line
    assert "RAGLINE_API__PORT" in line  # a stack on moved ports is not reached on the default one


def test_a_bulk_load_keeps_retrying_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "note.txt").write_text("A note.")
    load = subprocess.Popen(
        [RAGLINE, "ingest", str(tmp_path), "--kb", "k", "--server", NOWHERE],
        env=_env(),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert load.stderr is not None
        first = load.stderr.readline()  # the retries are seconds apart: the first comes at once
        assert f"cannot reach the Ragline API at {NOWHERE}" in first, first
        assert "retry 1 of 7" in first, first
        assert load.poll() is None  # still trying
    finally:
        load.kill()
        load.wait(timeout=BOUND_S)
    print(f"ingest: {first.strip()}")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_over_stdio_starts_and_answers_unavailable(tmp_path: Path) -> None:
    errors = tmp_path / "stderr.txt"
    params = StdioServerParameters(command=RAGLINE, args=["mcp"], env=_env(RAGLINE_OPENSEARCH__URL=NOWHERE))
    answers = {}
    with anyio.fail_after(BOUND_S * 2), errors.open("w") as errlog:
        async with (
            stdio_client(params, errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            for tool, arguments in [
                ("list_knowledge_bases", {}),
                ("search", {"query": "foo"}),
                ("ingest", {"kb_id": "k", "content": "A note."}),
            ]:
                result = await session.call_tool(tool, arguments)
                assert result.isError, (tool, result.content)
                answers[tool] = result.content[0].text  # type: ignore[union-attr]
    for tool, text in answers.items():
        assert text.startswith("UNAVAILABLE: OpenSearch is unreachable"), (tool, text)
        assert "make up" in text
        assert "RAGLINE_OPENSEARCH__URL" in text
    stderr = errors.read_text()
    assert "Traceback" not in stderr
    said = [line for line in stderr.splitlines() if "unreachable" in line]
    assert said == [
        f"ragline mcp: OpenSearch ({NOWHERE}) unreachable; serving anyway, the tools that need it answer "
        "UNAVAILABLE until it is up (locally, start the stack with `make up`; for a stack on other "
        "ports, set RAGLINE_OPENSEARCH__URL and RAGLINE_REDIS__URL)"
    ], stderr[-2000:]
    print(f"mcp stdio: stderr {len(stderr.splitlines())} lines; a tool call: {answers['search']}")

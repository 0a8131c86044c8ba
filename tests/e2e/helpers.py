"""Helpers of the end-to-end tests: the server handle, MCP sessions and polling like a user."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.types import CallToolResult, TextContent

MAX_FILE_BYTES = 256 * 1024  # the test server's per-file limit
# A streamable-HTTP session's first message, for tests that speak JSON-RPC by hand.
MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}


@dataclass(frozen=True)
class Server:
    url: str
    keys: dict[str, str]  # name -> secret: a_admin, a_read, b_admin, a_expired, a_revoked
    keys_file: Path  # re-read by the server on every request: edit it to add or revoke keys
    log: Path  # the server's stdout and stderr

    def client(self, key: str | None) -> httpx.Client:
        headers = {"X-Api-Key": self.keys[key]} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@asynccontextmanager
async def http_session(server: Server, key: str | None, **headers: str) -> AsyncIterator[ClientSession]:
    if key:
        headers["X-Api-Key"] = server.keys[key]
    async with (
        streamablehttp_client(f"{server.url}/mcp", headers=headers) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.isError, (tool, result.content)
    assert result.structuredContent is not None
    # The text copy, for clients that read only text, is the same result as compact JSON.
    (text,) = result.content
    assert isinstance(text, TextContent)
    assert json.loads(text.text) == result.structuredContent
    assert "\n " not in text.text
    return result.structuredContent


def error_text(result: CallToolResult) -> str:
    assert result.isError
    text = result.content[0].text  # type: ignore[union-attr]
    assert "Traceback" not in text
    return str(text)


@contextmanager
def extra_keys(server: Server) -> Iterator[Callable[[list[dict[str, Any]]], None]]:
    """Rewrite the running server's keys file as its keys plus the given entries; restored after."""
    original = server.keys_file.read_text()

    def write(entries: list[dict[str, Any]]) -> None:
        server.keys_file.write_text(json.dumps([*json.loads(original), *entries]))

    try:
        yield write
    finally:
        server.keys_file.write_text(original)


def tenant_of(server: Server, key: str) -> str:
    return str(next(e["tenant"] for e in json.loads(server.keys_file.read_text()) if e["name"] == key))


def wait_ready(
    client: httpx.Client, kb_id: str, doc_ids: list[str], timeout_s: float = 300
) -> dict[str, dict[str, object]]:
    """Poll GET .../documents/{doc_id} like a user until every document is ready or failed."""
    deadline = time.monotonic() + timeout_s
    docs: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline:
        docs = {d: client.get(f"/v1/kbs/{kb_id}/documents/{d}").json() for d in doc_ids}
        if all(doc.get("status") in ("ready", "failed") for doc in docs.values()):
            return docs
        time.sleep(0.5)
    pytest.fail(f"not terminal after {timeout_s}s: { {d: v.get('status') for d, v in docs.items()} }")


def wait_until(condition: Any, attempts: int = 60) -> None:
    """The registry's search side refreshes each second: poll like a user, at most a minute."""
    for _ in range(attempts):
        if condition():
            return
        time.sleep(1)
    pytest.fail("the condition did not come true within a minute")


RAGLINE = str(Path(sys.executable).parent / "ragline")


def bound_to_test(argv: list[str]) -> list[str]:
    """`argv`, run so that it ends (SIGTERM) when the test process does, however that ends: a worker
    or an API of a run killed from outside went on, in a session of its own, taking the next run's
    tasks from the same Redis database."""
    return ["setpriv", "--pdeathsig", "TERM", "--", *argv]


def run_cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The `ragline` CLI as a user runs it, with no terminal, its output captured."""
    return subprocess.run(
        [RAGLINE, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    tmp: Path, env_overrides: dict[str, str], port: int | None = None, command: tuple[str, ...] = ("serve",)
) -> tuple[Server, subprocess.Popen[bytes]]:
    """`ragline serve` (or another serving command, such as `mcp --transport sse`) on a free port
    with test keys: two tenants, a read-only key, dead keys."""
    run = secrets.token_hex(4)
    past = (datetime.now(UTC) - timedelta(hours=1)).isoformat()
    tenants: dict[str, tuple[str, str, dict[str, Any]]] = {
        "a_admin": (f"ta-{run}", "admin", {}),
        "a_read": (f"ta-{run}", "read", {}),
        "b_admin": (f"tb-{run}", "admin", {}),
        "a_expired": (f"ta-{run}", "admin", {"expires_at": past}),
        "a_revoked": (f"ta-{run}", "admin", {"revoked": True}),
    }
    keys = {name: f"test-{name}-{secrets.token_hex(16)}" for name in tenants}
    keys_file = tmp / "keys.json"
    keys_file.write_text(
        json.dumps(
            [
                {"key": keys[name], "tenant": tenant, "role": role, "name": name, **extra}
                for name, (tenant, role, extra) in tenants.items()
            ]
        )
    )
    port = port or free_port()
    env = {
        **os.environ,
        "RAGLINE_AUTH__KEYS_FILE": str(keys_file),
        "RAGLINE_API__PORT": str(port),
        **env_overrides,
    }
    env.pop("RAGLINE_AUTH__ALLOW_ANONYMOUS", None)
    log = tmp / "api.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            bound_to_test([RAGLINE, *command, "--port", str(port)]),
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the API exited during startup:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return Server(url=url, keys=keys, keys_file=keys_file, log=log), process
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    pytest.fail(f"the API did not start:\n{log.read_text()[-3000:]}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)


def wait_for_reembed(api: httpx.Client, kb: str, timeout_s: float = 900) -> dict[str, Any]:
    """The KB's view once its reembed has ended (moved, or failed with `reembed_error`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        view: dict[str, Any] = api.get(f"/v1/kbs/{kb}").json()
        if view["reembed"] is None:
            return view
        time.sleep(0.5)
    pytest.fail(f"reembed of {kb} still running after {timeout_s}s")


# Short documents on distinct subjects, one chunk each: what the reembed tests load and search.
TOPICS = {
    "garden.txt": "Gardening\n\nTomatoes need full sun, deep watering and stakes to climb the trellis.\n",
    "rockets.txt": "Rocketry\n\nLiquid oxygen and kerosene feed the first stage engines at launch.\n",
    "bread.txt": "Baking\n\nSourdough bread rises slowly with a wild yeast starter and a hot oven.\n",
    "chess.txt": "Chess\n\nThe queen's gambit offers a pawn early to gain control of the centre.\n",
    "tides.txt": "Oceans\n\nThe moon's gravity pulls the seas into two daily high tides.\n",
    "violin.txt": "Music\n\nA violin bow strung with horsehair and rosin makes the strings sing.\n",
}

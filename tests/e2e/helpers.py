"""Helpers of the end-to-end tests: the server handle and polling like a user."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

MAX_FILE_BYTES = 256 * 1024  # the test server's per-file limit


@dataclass(frozen=True)
class Server:
    url: str
    keys: dict[str, str]  # name -> secret: a_admin, a_read, b_admin

    def client(self, key: str | None) -> httpx.Client:
        headers = {"X-Api-Key": self.keys[key]} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


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


RAGLINE = str(Path(sys.executable).parent / "ragline")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(tmp: Path, env_overrides: dict[str, str]) -> tuple[Server, subprocess.Popen[bytes]]:
    """`ragline serve` on a free port with three test keys (two tenants, one read-only)."""
    run = secrets.token_hex(4)
    keys = {name: f"test-{name}-{secrets.token_hex(16)}" for name in ("a_admin", "a_read", "b_admin")}
    tenants = {
        "a_admin": (f"ta-{run}", "admin"),
        "a_read": (f"ta-{run}", "read"),
        "b_admin": (f"tb-{run}", "admin"),
    }
    keys_file = tmp / "keys.json"
    keys_file.write_text(
        json.dumps(
            [
                {"key": keys[name], "tenant": tenant, "role": role, "name": name}
                for name, (tenant, role) in tenants.items()
            ]
        )
    )
    port = _free_port()
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
            [RAGLINE, "serve", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"the API exited during startup:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return Server(url=url, keys=keys), process
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    pytest.fail(f"the API did not start:\n{log.read_text()[-3000:]}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    process.wait(timeout=30)

"""An API server of the project (`ragline serve`) with test keys, against the running local stack."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.helpers import MAX_FILE_BYTES, Server

RAGLINE = str(Path(sys.executable).parent / "ragline")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    run = secrets.token_hex(4)
    keys = {name: f"test-{name}-{secrets.token_hex(16)}" for name in ("a_admin", "a_read", "b_admin")}
    tenants = {
        "a_admin": (f"ta-{run}", "admin"),
        "a_read": (f"ta-{run}", "read"),
        "b_admin": (f"tb-{run}", "admin"),
    }
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
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
        "RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE_BYTES),
    }
    env.pop("RAGLINE_AUTH__ALLOW_ANONYMOUS", None)
    log = tmp_path_factory.mktemp("api") / "api.log"
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
                break
        except httpx.TransportError:
            time.sleep(0.3)
    else:
        process.kill()
        pytest.fail(f"the API did not start:\n{log.read_text()[-3000:]}")
    yield Server(url=url, keys=keys)
    process.terminate()
    process.wait(timeout=30)

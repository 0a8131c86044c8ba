"""Slowloris against `ragline serve`: connections that never finish their headers, and bodies that
drip, while others use the API. A server of its own with short bounds (1 s for headers and the
body's grace, 1,000 bytes a second after it)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.helpers import Server, start_server, stop_server

pytestmark = pytest.mark.e2e

IDLE_CONNECTIONS = 200


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("paced"),
        {
            "RAGLINE_API__HEADER_TIMEOUT_S": "1",
            "RAGLINE_API__BODY_GRACE_S": "1",
            "RAGLINE_API__BODY_MIN_BYTES_PER_S": "1000",
        },
    )
    yield handle
    stop_server(process)


def _address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _closed_unanswered(server: Server, prefix: bytes) -> float:
    """Send `prefix` (part of a request's head) and wait: seconds until the server closed it."""
    began = time.monotonic()
    with socket.create_connection(_address(server), timeout=30) as conn:
        conn.sendall(prefix)
        assert conn.recv(65536) == b""  # no answer, only the close
    return time.monotonic() - began


def _dripped_body(server: Server, path: str, key: str) -> bytes:
    """A POST whose body stops after 100 of its 100,000 bytes: what the server answers."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Api-Key: {key}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        "Content-Length: 100000\r\n\r\n"
    ).encode()
    answer = b""
    with socket.create_connection(_address(server), timeout=30) as conn:
        conn.sendall(head + b" " * 100)
        while chunk := conn.recv(65536):
            answer += chunk
    return answer


def test_idle_and_dripping_clients_are_let_go_while_others_are_served(paced: Server) -> None:
    key = paced.keys["a_admin"]
    with paced.client("a_admin") as admin:
        assert admin.post("/v1/kbs", json={"kb_id": "slow-kb", "name": "slow"}).status_code in (201, 409)
    with ThreadPoolExecutor(max_workers=IDLE_CONNECTIONS + 4) as pool:
        idle = [
            pool.submit(_closed_unanswered, paced, b"GET /v1/kbs HTTP/1.1\r\nHost: 127.")
            for _ in range(IDLE_CONNECTIONS)
        ]
        silent = pool.submit(_closed_unanswered, paced, b"")
        uploads = pool.submit(_dripped_body, paced, "/v1/kbs/slow-kb/documents", key)
        mcp = pool.submit(_dripped_body, paced, "/mcp", key)
        with paced.client("a_read") as client:
            assert client.get("/v1/kbs").status_code == 200  # served while the others hang on
        held = [future.result() for future in idle] + [silent.result()]
        answers = {"upload": uploads.result(), "mcp": mcp.result()}
    assert max(held) < 15, max(held)
    for front, answer in answers.items():
        status, _, body = answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 408"), (front, answer[:300])
        assert json.loads(body)["code"] == "REQUEST_TIMEOUT", front
    log = paced.log.read_text()
    assert "Traceback" not in log
    assert "refused a request: the request body arrived slower than 1000 bytes a second" in log


def test_a_connection_idle_as_long_as_a_clients_pool_keeps_it_still_serves(paced: Server) -> None:
    """Both sides let an idle connection go after 5 s: a busy server's close met the client's next
    request, which was lost to a reset connection (a burst of 300 saw one ReadError)."""
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    with socket.create_connection(_address(paced), timeout=30) as conn:
        for _ in range(2):
            conn.sendall(request)
            assert _whole_response(conn).startswith(b"HTTP/1.1 200"), "closed while idle"
            time.sleep(6)  # past the 5 s both sides used, within the server's bound


def _whole_response(conn: socket.socket) -> bytes:
    """One response, its head and its Content-Length of body (they may come in separate reads),
    or what came before the server closed the connection."""
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := conn.recv(65536)):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    ]
    while lengths and len(body) < int(lengths[0]) and (chunk := conn.recv(65536)):
        body += chunk
    return answer if not lengths else head + b"\r\n\r\n" + body

"""Slow clients against a real uvicorn server on loopback, with short bounds: a connection whose
headers never finish is closed, a body that falls behind the least rate gets 408, and clients that
keep up (a large body sent at once, a kept-alive connection, a streamed answer) are untouched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from services.core.slow_clients import BodyRate, header_timeout
from shared.config import ApiSettings

HEADER_S, GRACE_S, RATE, IDLE_S = 0.6, 0.6, 1000, 2.0
API = ApiSettings(body_grace_s=GRACE_S, body_min_bytes_per_s=RATE, body_idle_s=IDLE_S)


async def echo(request: Request) -> JSONResponse:
    return JSONResponse({"bytes": len(await request.body())})


async def stream(request: Request) -> StreamingResponse:
    await request.body()

    async def parts() -> AsyncIterator[bytes]:
        for part in (b"one ", b"two"):
            await asyncio.sleep(GRACE_S)  # past the grace: the body is whole, so nothing is timed
            yield part

    return StreamingResponse(parts())


async def busy(request: Request) -> JSONResponse:
    """Works a while before it reads its body (checks, lookups) and between its parts (storing each)."""
    await asyncio.sleep(GRACE_S * 2)
    size = 0
    async for part in request.stream():
        size += len(part)
        await asyncio.sleep(GRACE_S)
    return JSONResponse({"bytes": size})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    app = Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/stream", stream, methods=["POST"]),
            Route("/busy", busy, methods=["POST"]),
        ],
        middleware=[Middleware(BodyRate, api=API)],
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    config = uvicorn.Config(app, host="127.0.0.1", port=free, log_config=None, http=header_timeout(HEADER_S))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield free
    server.should_exit = True
    thread.join(10)


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_all(conn: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket's timeout bounds it)."""
    out = b""
    while chunk := conn.recv(65536):
        out += chunk
    return out


def _request(path: str, body: bytes, *, close: bool = True) -> bytes:
    connection = b"close" if close else b"keep-alive"
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: ".encode()
    return head + connection + b"\r\n\r\n" + body


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with _connect(port) as conn:
        began = time.monotonic()
        assert _read_all(conn) == b""
        assert time.monotonic() - began < HEADER_S + 5


def test_headers_dripped_a_byte_at_a_time_never_finish(port: int) -> None:
    request = _request("/echo", b"x")
    assert len(request) * 0.05 > HEADER_S * 2
    with _connect(port) as conn:
        try:
            for byte in request:
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
            answer = _read_all(conn)
        except (ConnectionResetError, BrokenPipeError):  # closed while we still sent
            answer = b""
    assert answer == b""  # closed, never answered


def test_a_body_below_the_least_rate_gets_408_and_the_connection_ends(port: int) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    with _connect(port) as conn:
        conn.sendall(head + b"a" * 100)
        answer = _read_all(conn)  # the server closes it after the answer
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 408"), answer
    assert b"connection: close" in status.lower()
    envelope = json.loads(body)
    assert envelope["code"] == "REQUEST_TIMEOUT"
    assert envelope["details"] == {"received_bytes": 100, "min_bytes_per_s": RATE, "idle_s": IDLE_S}
    assert envelope["message"] == f"the request body arrived slower than {RATE} bytes a second"


def test_clients_that_keep_up_are_untouched(port: int) -> None:
    big = b"b" * (4 << 20)
    with _connect(port) as conn:
        conn.sendall(_request("/echo", big, close=False))
        time.sleep(HEADER_S * 1.5)  # kept alive past the header bound: idle, not slow
        conn.sendall(_request("/stream", b"s" * 10))
        answer = _read_all(conn)
    assert answer.count(b"HTTP/1.1 200") == 2, answer
    assert f'{{"bytes":{len(big)}}}'.encode() in answer
    assert answer.endswith(b"one \r\n3\r\ntwo\r\n0\r\n\r\n")  # the streamed parts, whole


def test_an_app_busy_between_its_reads_does_not_make_the_client_slow(port: int) -> None:
    """The server reads no more while the app works, so the client cannot keep any rate then."""
    for body in (b"small", b"p" * (2 << 20)):
        with _connect(port) as conn:
            conn.sendall(_request("/busy", body))
            answer = _read_all(conn)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
        assert f'{{"bytes":{len(body)}}}'.encode() in answer


def test_a_burst_buys_no_more_silence_than_the_idle_bound(port: int) -> None:
    """At the rate alone 100 KB bought 100 s of silence (the adversary held 20 MiB bodies for hours)."""
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
    with _connect(port) as conn:
        began = time.monotonic()
        conn.sendall(head + b"a" * 100_000)
        answer = _read_all(conn)
        held = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert held < 100_000 / RATE / 2  # the idle bound, not the rate's credit, ended it
    assert (
        json.loads(answer.partition(b"\r\n\r\n")[2])["message"]
        == f"the request body paused over {IDLE_S:g} s"
    )


def test_the_next_request_on_a_kept_connection_has_the_header_bound_not_twice_it(port: int) -> None:
    """The first request's timer went on after its headers came; a second request dripped after it
    then found a stale timer and got a fresh one only when that ran out."""
    with _connect(port) as conn:
        conn.sendall(_request("/echo", b"one", close=False))
        assert conn.recv(65536).startswith(b"HTTP/1.1 200")
        began = time.monotonic()
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            for byte in _request("/echo", b"two"):
                conn.sendall(bytes([byte]))
                time.sleep(0.05)
                if time.monotonic() - began > HEADER_S * 4:
                    break
            assert _read_all(conn) == b""
    assert time.monotonic() - began < HEADER_S * 1.9


def test_a_trickle_after_a_burst_does_not_live_on_the_bursts_credit(port: int) -> None:
    """Each wait under the idle bound, a byte now and then kept a 19 MiB burst's upload (and its
    share of the buffer budget) alive for hours in the adversary's second pass."""
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
    answer, trickled = b"", 0
    with _connect(port) as conn:
        conn.sendall(head + b"a" * 100_000)
        conn.settimeout(IDLE_S * 0.75)
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            while not answer and trickled < 20:  # 20 waits of 0.75 the idle bound: 30 s on a 2 s bound
                try:
                    answer = conn.recv(65536)
                except TimeoutError:
                    conn.sendall(b"a")
                    trickled += 1
    assert answer.startswith(b"HTTP/1.1 408"), answer[:300]
    assert trickled < 5  # the burst's credit is the idle bound's worth, spent within a few waits

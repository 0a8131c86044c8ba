"""The REST front's own policies, on small ASGI apps: key before body, body limits, Host/Origin,
and single-flight calls that never take the routes' threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from kombu.exceptions import OperationalError
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.types import Message, Receive, Scope, Send

from services.api import errors
from services.api.app import BodyLimit, body_limits
from services.api.auth_gate import AuthGate, resolved
from services.api.host_check import HostCheck, allowed
from services.api.single_flight import SingleFlight
from services.core import buffer_budget
from services.core.auth import KeyRing
from services.core.buffer_budget import BufferBudget
from services.core.identity import Authenticator
from services.mcp.sessions import EnvelopeBodyLimit
from shared.config import ApiKey, ApiSettings, AuthSettings
from shared.errors import ErrorCode, RaglineError

pytestmark = pytest.mark.anyio

KEY = "unit-front-key-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Recorder:
    """An app that reads the whole body, and says what it read and who the gate said called."""

    def __init__(self) -> None:
        self.read = 0
        self.calls = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls += 1
        more = True
        while more:
            message = await receive()
            self.read += len(message.get("body", b""))
            more = message.get("more_body", False)
        principal = resolved(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": (principal.tenant if principal else "-").encode()})


def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000")


async def _chunks(total: int, size: int = 64 << 10) -> AsyncIterator[bytes]:
    for _ in range(total // size):
        yield b"x" * size


async def test_the_key_is_checked_before_the_body_is_read() -> None:
    inner = Recorder()
    auth = AuthSettings(api_keys=[ApiKey(key=KEY, tenant="acme", role="read")])
    async with _client(AuthGate(inner, Authenticator(KeyRing(auth, "default"), auth.oauth))) as client:
        refused = await client.post("/v1/search", content=_chunks(8 << 20))
        assert refused.status_code == 401
        assert refused.json()["code"] == "AUTH_ERROR"
        assert refused.headers["www-authenticate"] == 'Bearer realm="ragline"'
        assert inner.calls == 0
        taken = await client.post("/v1/search", content=b"{}", headers={"X-Api-Key": KEY})
        assert (taken.status_code, taken.text) == (200, "acme")
        # Outside /v1 the gate lets requests by: probes answer without a key, /mcp has its own gate.
        assert (await client.get("/healthz")).text == "-"


async def test_the_anonymous_principal_is_resolved_by_the_gate() -> None:
    inner = Recorder()
    auth = AuthSettings(allow_anonymous=True)
    async with _client(AuthGate(inner, Authenticator(KeyRing(auth, "local"), auth.oauth))) as client:
        assert (await client.get("/v1/kbs")).text == "local"


def test_only_uploads_take_the_large_limit() -> None:
    api = ApiSettings(max_json_bytes=1 << 20, max_request_bytes=64 << 20, max_file_bytes=8 << 20)
    limit = body_limits(api)

    def of(method: str, path: str) -> int:
        return limit({"type": "http", "method": method, "path": path})

    assert of("POST", "/v1/kbs/docs/documents") == 64 << 20
    assert of("POST", "/v1/kbs/docs/documents/") == 64 << 20
    assert of("POST", "/mcp") == 64 << 20
    # The JSON form is read and parsed whole: room for one file as text and its metadata.
    headers = [(b"content-type", b"application/json")]
    json_upload = {"type": "http", "method": "POST", "path": "/v1/kbs/docs/documents", "headers": headers}
    assert limit(json_upload) == api.json_upload_limit == (10 << 20) + (128 << 10)
    for method, path in (
        ("POST", "/v1/search"),
        ("POST", "/v1/kbs"),
        ("PATCH", "/v1/kbs/docs"),
        ("POST", "/v1/kbs/docs/reembed"),
        ("POST", "/v1/kbs/docs/documents/a.txt/reingest"),
        ("PUT", "/v1/kbs/docs/documents"),
    ):
        assert of(method, path) == 1 << 20, (method, path)


async def test_a_body_over_its_limit_is_refused_while_it_streams() -> None:
    inner = Recorder()
    limit = 256 << 10
    async with _client(BodyLimit(inner, lambda _: limit)) as client:
        refused = await client.post("/v1/search", content=_chunks(8 << 20))
        assert refused.status_code == 413
        assert refused.json() == {
            "code": "TOO_LARGE",
            "message": f"the request exceeds {limit} bytes",
            "details": {"limit": limit},
        }
        assert inner.read <= limit


async def test_a_body_error_the_app_answers_itself_is_still_too_large() -> None:
    """FastAPI answers a body it could not read with its own 400; the client must see 413."""

    async def parses_for_itself(scope: Scope, receive: Receive, send: Send) -> None:
        try:
            while (await receive()).get("more_body"):
                pass
        except Exception:  # noqa: BLE001  (as FastAPI does: any error reading the body is a 400)
            await send({"type": "http.response.start", "status": 400, "headers": []})
            await send({"type": "http.response.body", "body": b"There was an error parsing the body"})

    async with _client(BodyLimit(parses_for_itself, lambda _: 1024)) as client:
        refused = await client.post("/v1/search", content=_chunks(1 << 20, 4096))
        assert refused.status_code == 413
        assert refused.json()["code"] == "TOO_LARGE"


SECURITY = TransportSecuritySettings(
    allowed_hosts=["127.0.0.1", "127.0.0.1:*", "localhost:*", "api.example.org"],
    allowed_origins=["http://127.0.0.1:*", "https://api.example.org", "https://app.example.org"],
)
HOSTS = ["127.0.0.1", "127.0.0.1:8000", "localhost:9", "localhost", "api.example.org", "api.example.org:443",
         "127.0.0.1.evil.example", "127.0.0.1:", "evil.example", "API.EXAMPLE.ORG"]  # fmt: skip
ORIGINS = ["http://127.0.0.1:8000", "http://127.0.0.1", "https://app.example.org", "https://app.example.org:8443",
           "http://api.example.org", "https://evil.example", "null"]  # fmt: skip


def test_hosts_and_origins_match_as_on_mcp() -> None:
    sdk = TransportSecurityMiddleware(SECURITY)
    for host in HOSTS:
        assert allowed(host, SECURITY.allowed_hosts) is sdk._validate_host(host), host
    for origin in ORIGINS:
        assert allowed(origin, SECURITY.allowed_origins) is sdk._validate_origin(origin), origin


async def test_a_foreign_host_or_origin_is_refused_on_rest_only() -> None:
    inner = Recorder()
    async with _client(HostCheck(inner, SECURITY)) as client:
        for headers, header in (
            ({"Origin": "https://evil.example"}, "Origin"),
            ({"Origin": "null"}, "Origin"),
            ({"Host": "evil.example"}, "Host"),
            ({"Host": "evil.example:8000", "Origin": "http://evil.example:8000"}, "Host"),
        ):
            refused = await client.post("/v1/kbs", json={}, headers=headers)
            assert refused.status_code == 403, headers
            assert refused.json()["code"] == "FORBIDDEN"
            assert refused.json()["details"] == {"header": header}
        assert inner.calls == 0
        assert (await client.get("/v1/kbs")).status_code == 200  # no Origin: the CLI, httpx, curl
        assert (await client.get("/v1/kbs", headers={"Origin": "https://app.example.org"})).status_code == 200
        assert (await client.get("/metrics", headers={"Host": "10.1.2.3:8000"})).status_code == 200


async def test_concurrent_callers_share_one_call_in_its_own_thread() -> None:
    release = threading.Event()
    calls: list[str] = []

    def slow() -> int:
        calls.append(threading.current_thread().name)
        release.wait(10)
        return len(calls)

    flight = SingleFlight(slow, fresh_s=60, wait_s=30, late=lambda: -1)
    waiting = [asyncio.ensure_future(flight.get()) for _ in range(50)]
    while not calls:
        await asyncio.sleep(0.01)
    release.set()
    assert await asyncio.gather(*waiting) == [1] * 50
    assert await flight.get() == 1  # fresh: no second call
    assert len(calls) == 1


async def test_a_caller_past_its_wait_gets_the_late_answer_and_no_second_call_starts() -> None:
    release = threading.Event()
    calls = 0

    def stuck() -> str:
        nonlocal calls
        calls += 1
        release.wait(10)
        return "answer"

    flight = SingleFlight(stuck, fresh_s=0, wait_s=0.05, late=lambda: "late")
    assert await flight.get() == "late"
    assert await flight.get() == "late"  # the first call is still in flight: it is not started again
    assert calls == 1
    release.set()
    for _ in range(200):  # the call in flight ends, and its answer goes to whoever waits for it
        if await flight.get() == "answer":
            break
        await asyncio.sleep(0.05)
    assert calls == 1
    assert await flight.get() == "answer"  # after it (fresh for 0 s), the next caller starts another
    assert calls == 2


def test_a_broker_that_cannot_take_a_send_is_unavailable() -> None:
    """A send past the broker pool's bound (shared/queue.py) raises OperationalError: a 503, not a 500."""
    app = FastAPI()
    errors.install(app)

    @app.post("/send")
    def send() -> None:
        raise OperationalError("Timed out waiting for a broker connection after 10.0s.")

    with TestClient(app) as client:
        response = client.post("/send")
    assert response.status_code == 503
    assert response.json()["code"] == "UNAVAILABLE"


async def test_a_client_that_leaves_mid_body_is_no_server_error(caplog: pytest.LogCaptureFixture) -> None:
    """A dropped upload logged an "unhandled error" with its traceback, at error level."""
    app = FastAPI()
    errors.install(app)

    @app.post("/upload")
    async def upload(request: Request) -> None:
        await request.body()

    part: Message = {"type": "http.request", "body": b"part", "more_body": True}
    messages = iter([part, {"type": "http.disconnect"}])
    sent: list[Message] = []

    async def receive() -> Message:
        return next(messages)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/upload", "headers": [], "query_string": b""}
    await app(scope, receive, send)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert sent[0]["status"] < 500


def test_a_budget_lets_one_request_through_alone_and_refuses_past_it() -> None:
    budget = BufferBudget(100)
    budget.take(150, 0)  # alone: its own body limit bounds it
    with pytest.raises(RaglineError) as busy:
        budget.take(10, 0)
    assert busy.value.code == ErrorCode.UNAVAILABLE
    budget.take(10, 150)  # the same request reading on
    budget.give(160)
    budget.take(60, 0)
    budget.take(40, 0)
    assert budget.held == 100


async def test_bodies_read_whole_at_once_are_bounded_across_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four MCP ingests of the largest file took an API process from 0.3 to 2.3 GB, each within its
    own limit: the second body read whole while the first is held is refused, with Retry-After."""
    monkeypatch.setattr(buffer_budget.BUDGET, "limit_bytes", 1000)
    app = FastAPI()
    errors.install(app)
    held = asyncio.Event()
    release = asyncio.Event()

    @app.post("/v1/kbs/{kb}/documents")
    async def upload(request: Request) -> dict[str, int]:
        size = len(await request.body())
        held.set()
        await release.wait()
        return {"read": size}

    limited = BodyLimit(app, lambda _: 1 << 20)
    json = {"content-type": "application/json"}
    async with _client(limited) as client:
        first = asyncio.create_task(client.post("/v1/kbs/k/documents", content=b"x" * 800, headers=json))
        await held.wait()
        refused = await client.post("/v1/kbs/k/documents", content=b"y" * 800, headers=json)
        assert refused.status_code == 503
        assert refused.json()["code"] == "UNAVAILABLE"
        assert refused.headers["retry-after"]
        small = await client.post("/v1/search", content=b"z" * 800)  # not read whole: not counted
        assert small.status_code != 503
        release.set()
        assert (await first).json() == {"read": 800}
    assert buffer_budget.BUDGET.held == 0
    lone = EnvelopeBodyLimit(Recorder(), max_body_size=1 << 20)
    async with _client(lone) as client:  # an MCP message alone may pass the budget
        message = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' + b"p" * 1950 + b'"}}'
        assert (await client.post("/mcp", content=message)).status_code == 200
    assert buffer_budget.BUDGET.held == 0

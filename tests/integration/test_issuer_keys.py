"""The issuer's keys (services/core/access_tokens.py IssuerKeys) against a real issuer on loopback
whose JWKS endpoint misbehaves: failing, malformed, endless or huge answers must end in a clear
error or the last good keys, never a crash, a hang, or a fetch for every request."""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from services.core.access_tokens import AccessTokens, IssuerKeys
from shared.config import OAuthSettings
from shared.errors import ErrorCode, RaglineError

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
GUARD_S = 1  # jwks_refetch_s of these tests: the least time between two early fetches


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _rsa_jwk(kid: Any) -> dict[str, Any]:
    numbers = rsa.generate_private_key(65537, 2048).public_key().public_numbers()
    return {"kty": "RSA", "use": "sig", "kid": kid, "n": _b64(numbers.n), "e": _b64(numbers.e)}


@dataclass
class Jwks:
    """What the issuer's JWKS endpoint answers next: a status and a body, dripped or whole."""

    url: str = ""
    status: int = 200
    body: bytes = b""
    drip_s: float = 0.0  # > 0: one byte per drip_s of a body that never ends in practice
    fetches: int = 0
    sent: list[int] = field(default_factory=list)  # bytes written per fetch before it ended
    by_path: dict[str, bytes] = field(default_factory=dict)  # other paths' answers (issuer metadata)

    def serve(self, status: int, document: Any) -> None:
        self.status, self.drip_s = status, 0.0
        self.body = document if isinstance(document, bytes) else json.dumps(document).encode()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def jwks() -> Iterator[Jwks]:
    state = Jwks()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path in state.by_path:
                body = state.by_path[self.path]
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            state.fetches += 1
            length = 1 << 30 if state.drip_s else len(state.body)
            self.send_response(state.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(length))
            self.end_headers()
            written = 0
            try:
                if state.drip_s:
                    while written < length:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        written += 1
                        time.sleep(state.drip_s)
                else:
                    for start in range(0, len(state.body), 1 << 16):
                        written += self.wfile.write(state.body[start : start + (1 << 16)])
            except OSError:
                pass  # the reader went away
            state.sent.append(written)

        def log_message(self, *_: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    http.daemon_threads = True
    state.url = f"http://127.0.0.1:{http.server_address[1]}/jwks.json"
    threading.Thread(target=http.serve_forever, daemon=True).start()
    yield state
    http.shutdown()


def _keys(jwks: Jwks) -> IssuerKeys:
    return IssuerKeys(
        OAuthSettings(
            issuer="http://127.0.0.1:1",
            resource="http://127.0.0.1:2/mcp",
            jwks_url=jwks.url,
            jwks_refetch_s=GUARD_S,
        )
    )


async def _unavailable(keys: IssuerKeys, kid: str) -> RaglineError:
    with pytest.raises(RaglineError) as refused:
        await keys.key(kid)
    assert refused.value.code == ErrorCode.UNAVAILABLE, refused.value.message
    return refused.value


@pytest.mark.parametrize(
    "document",
    [
        {"keys": None},
        {"keys": 5},
        {"keys": {"kid": "k1"}},
        [{"kid": "k1"}],
        b"[" * 100_000 + b"]" * 100_000,
        b"<html>",
    ],
    ids=["keys null", "keys a number", "keys an object", "a list", "nested too deep", "not JSON"],
)
async def test_a_jwks_that_is_no_key_set_is_unavailable_not_a_crash(jwks: Jwks, document: Any) -> None:
    jwks.serve(200, document)
    await _unavailable(_keys(jwks), "k1")


async def test_one_malformed_key_does_not_hide_the_good_ones(jwks: Jwks) -> None:
    good = _rsa_jwk("k1")
    odd = [
        _rsa_jwk(["a", "list"]),
        _rsa_jwk({"an": "object"}),
        {**_rsa_jwk("alg-list"), "alg": ["RS256"]},
        {**_rsa_jwk("alg-object"), "alg": {"a": 1}},
        {**_rsa_jwk("n-number"), "n": 5},
        {"kty": "oct", "kid": "secret", "k": "c2VjcmV0"},
        "not a key",
    ]
    jwks.serve(200, {"keys": [*odd, good]})
    found = await _keys(jwks).key("k1")
    assert found.key.key_id == "k1"


async def test_while_the_issuer_fails_forged_key_ids_do_not_make_a_fetch_each(jwks: Jwks) -> None:
    jwks.serve(200, {"keys": [_rsa_jwk("k1")]})
    keys = _keys(jwks)
    await keys.key("k1")
    await asyncio.sleep(GUARD_S + 0.5)  # past the guard: the next unknown key id may fetch once
    jwks.serve(500, b"down")
    before = jwks.fetches
    forged = [keys.key(f"forged-{n}") for n in range(20)]
    outcomes = await asyncio.gather(*forged, return_exceptions=True)
    for _ in range(10):
        with pytest.raises(RaglineError):
            await keys.key("forged-again")
    assert all(isinstance(o, RaglineError) and o.code == ErrorCode.AUTH_ERROR for o in outcomes), outcomes
    assert jwks.fetches - before == 1, "a failing issuer was asked once per request"
    assert (await keys.key("k1")).key.key_id == "k1", "the last good keys serve while the issuer fails"


async def test_without_keys_a_failing_issuer_is_asked_once_per_guard(jwks: Jwks) -> None:
    jwks.serve(503, b"starting")
    keys = _keys(jwks)
    for _ in range(10):
        await _unavailable(keys, "k1")
    assert jwks.fetches == 1
    await asyncio.sleep(GUARD_S + 0.5)
    jwks.serve(200, {"keys": [_rsa_jwk("k1")]})
    assert (await keys.key("k1")).key.key_id == "k1", "the issuer is asked again after the guard"


@pytest.mark.timeout(120)
async def test_a_jwks_that_never_ends_is_given_up_on(jwks: Jwks) -> None:
    """A server that sends a byte now and then never trips a per-read timeout; the fetch as a
    whole has a deadline, so the lock every token check waits on is released."""
    jwks.drip_s = 1.0
    keys = _keys(jwks)
    await _unavailable(keys, "k1")
    jwks.serve(200, {"keys": [_rsa_jwk("k1")]})
    await asyncio.sleep(GUARD_S + 0.5)
    assert (await keys.key("k1")).key.key_id == "k1", "a later fetch is not stuck behind the first"


async def test_a_huge_jwks_is_refused_before_it_is_read_whole(jwks: Jwks) -> None:
    jwks.serve(200, b" " * (64 << 20))
    error = await _unavailable(_keys(jwks), "k1")
    assert "ValueError" in error.message
    for _ in range(100):  # the server's thread records the bytes it wrote once its write fails
        if jwks.sent:
            break
        await asyncio.sleep(0.1)
    assert jwks.sent, "the server never finished its answer"
    assert jwks.sent[0] < len(jwks.body), "the whole body was downloaded"


@pytest.mark.parametrize(("named", "found"), [("the issuer", True), ("another issuer", False)])
async def test_discovery_takes_keys_only_from_metadata_that_names_the_issuer(
    jwks: Jwks, named: str, found: bool
) -> None:
    """RFC 8414 section 3.3: the metadata's `issuer` is the configured one, exactly."""
    origin = jwks.url.removesuffix("/jwks.json")
    issuer = f"{origin}/tenant-a"
    claimed = issuer if named == "the issuer" else f"{origin}/tenant-b"
    metadata = json.dumps({"issuer": claimed, "jwks_uri": jwks.url}).encode()
    jwks.by_path = {
        "/.well-known/oauth-authorization-server/tenant-a": metadata,
        "/tenant-a/.well-known/openid-configuration": metadata,
    }
    jwks.serve(200, {"keys": [_rsa_jwk("k1")]})
    keys = IssuerKeys(OAuthSettings(issuer=issuer, resource="http://127.0.0.1:2/mcp", jwks_refetch_s=GUARD_S))
    if found:
        assert (await keys.key("k1")).key.key_id == "k1"
    else:
        error = await _unavailable(keys, "k1")
        assert "ValueError" in error.message
        assert jwks.fetches == 0, "the keys of metadata naming another issuer were fetched"


async def test_a_token_whose_time_claims_are_not_numbers_is_refused_as_malformed(jwks: Jwks) -> None:
    private = rsa.generate_private_key(65537, 2048)
    numbers = private.public_key().public_numbers()
    jwks.serve(
        200, {"keys": [{"kty": "RSA", "use": "sig", "kid": "k1", "n": _b64(numbers.n), "e": _b64(numbers.e)}]}
    )
    settings = OAuthSettings(
        issuer="http://127.0.0.1:1",
        resource="http://127.0.0.1:2/mcp",
        jwks_url=jwks.url,
        jwks_refetch_s=GUARD_S,
    )
    claims = {"iss": settings.issuer, "aud": settings.resource, "org": "acme", "scope": "ragline:read"}
    tokens = AccessTokens(settings)
    for odd in ({"exp": "soon"}, {"exp": int(time.time()) + 300, "nbf": "later"}):
        token = jwt.encode(claims | odd, private, algorithm="RS256", headers={"kid": "k1"})
        with pytest.raises(RaglineError) as refused:
            await tokens.principal(token)
        assert refused.value.code == ErrorCode.AUTH_ERROR
        assert refused.value.message.endswith("its claims are malformed"), refused.value.message

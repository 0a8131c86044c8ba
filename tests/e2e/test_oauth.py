"""OAuth 2.1 bearer tokens on REST and MCP, against a real API and a real issuer on loopback.

The issuer is an HTTP server of the test's own (RFC 8414 metadata and a JWKS), and every token
is signed with a key pair generated here. The API discovers the JWKS from the issuer's metadata.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from tests.e2e.helpers import RAGLINE, Server, call, free_port, start_server, stop_server

pytestmark = [pytest.mark.e2e]
REFETCH_S = 10  # the server's guard between two JWKS fetches for unknown key ids


def _b64(number: int) -> str:
    raw = number.to_bytes((number.bit_length() + 7) // 8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey = field(default_factory=lambda: rsa.generate_private_key(65537, 2048))

    def jwk(self) -> dict[str, str]:
        numbers = self.private.public_key().public_numbers()
        return {
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": self.kid,
            "n": _b64(numbers.n),
            "e": _b64(numbers.e),
        }


@dataclass
class Issuer:
    """An authorization server's public face: its metadata and the keys it signs with."""

    url: str
    keys: list[SigningKey]
    jwks_fetches: int = 0

    def token(self, signer: SigningKey | None = None, /, **claims: Any) -> str:
        now = int(time.time())
        body = {"iss": self.url, "sub": "agent-1", "iat": now, "exp": now + 300, **claims}
        body = {k: v for k, v in body.items() if v is not None}
        signer = signer or self.keys[0]
        return jwt.encode(body, signer.private, algorithm="RS256", headers={"kid": signer.kid})


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    port = free_port()
    issuer = Issuer(url=f"http://127.0.0.1:{port}", keys=[SigningKey(kid="k1")])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body: dict[str, Any]
            if self.path == "/.well-known/oauth-authorization-server":
                body = {"issuer": issuer.url, "jwks_uri": f"{issuer.url}/jwks.json"}
            elif self.path == "/jwks.json":
                issuer.jwks_fetches += 1
                body = {"keys": [key.jwk() for key in issuer.keys]}
            else:
                self.send_error(404)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: Any) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield issuer
    http.shutdown()


@dataclass(frozen=True)
class OAuthApi:
    server: Server
    resource: str
    metadata_url: str


@pytest.fixture(scope="module")
def api(issuer: Issuer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OAuthApi]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    env = {
        "RAGLINE_AUTH__OAUTH__ISSUER": issuer.url,
        "RAGLINE_AUTH__OAUTH__RESOURCE": resource,
        "RAGLINE_AUTH__OAUTH__TENANT_CLAIM": "org",
        "RAGLINE_AUTH__OAUTH__ROLE_CLAIM": "scope",
        "RAGLINE_AUTH__OAUTH__JWKS_REFETCH_S": str(REFETCH_S),
    }
    server, process = start_server(tmp_path_factory.mktemp("oauth"), env, port=port)
    yield OAuthApi(server, resource, f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp")
    stop_server(process)


def _tenant() -> str:
    return f"oa-{secrets.token_hex(4)}"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_the_protected_resource_metadata_names_the_issuer(api: OAuthApi, issuer: Issuer) -> None:
    for path in ("/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"):
        metadata = httpx.get(f"{api.server.url}{path}").json()
        assert metadata["resource"] == api.resource
        assert metadata["authorization_servers"] == [issuer.url]
        assert metadata["bearer_methods_supported"] == ["header"]
        assert "ragline:read" in metadata["scopes_supported"]


def test_a_valid_token_acts_for_its_tenant_and_role_on_rest(api: OAuthApi, issuer: Issuer) -> None:
    tenant, other = _tenant(), _tenant()
    admin = issuer.token(aud=api.resource, org=tenant, scope="openid ragline:admin")
    reader = issuer.token(aud=api.resource, org=tenant, scope="ragline:read")
    stranger = issuer.token(aud=api.resource, org=other, scope="ragline:admin")
    kb = f"kb-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=api.server.url, timeout=30) as http:
        created = http.post("/v1/kbs", json={"kb_id": kb, "name": "oauth"}, headers=_bearer(admin))
        assert created.status_code == 201, created.text
        listed = http.get("/v1/kbs", headers=_bearer(reader)).json()
        assert [k["kb_id"] for k in listed["knowledge_bases"]] == [kb]
        refused = http.post("/v1/kbs", json={"kb_id": "kb-r", "name": "r"}, headers=_bearer(reader))
        assert (refused.status_code, refused.json()["code"]) == (403, "FORBIDDEN")
        assert http.get("/v1/kbs", headers=_bearer(stranger)).json()["knowledge_bases"] == []
        assert http.get(f"/v1/kbs/{kb}", headers=_bearer(stranger)).status_code == 404
        assert http.delete(f"/v1/kbs/{kb}", headers=_bearer(admin)).status_code in (200, 202, 204)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_a_valid_token_opens_an_mcp_session(api: OAuthApi, issuer: Issuer) -> None:
    tenant = _tenant()
    token = issuer.token(aud=api.resource, org=tenant, scope=["ragline:write"])
    async with (
        streamablehttp_client(api.resource, headers=_bearer(token)) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        kb = f"kb-{uuid.uuid4().hex[:6]}"
        await call(session, "create_knowledge_base", kb_id=kb, name="via oauth")
        listed = await call(session, "list_knowledge_bases")
        assert [k["kb_id"] for k in listed["knowledge_bases"]] == [kb]
    admin = issuer.token(aud=api.resource, org=tenant, scope="ragline:admin")
    httpx.delete(f"{api.server.url}/v1/kbs/{kb}", headers=_bearer(admin)).raise_for_status()


def _bad_tokens(api: OAuthApi, issuer: Issuer) -> dict[str, str]:
    tenant = _tenant()
    good: dict[str, Any] = {"aud": api.resource, "org": tenant, "scope": "ragline:admin"}
    foreign_key = SigningKey(kid="k1")  # the issuer's key id, another key
    claims = {**good, "iss": issuer.url, "exp": int(time.time()) + 300}
    unsigned = _part({"alg": "none", "typ": "JWT"}).decode() + "." + _part(claims).decode() + "."
    public_pem = (
        issuer.keys[0].private.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    return {
        "wrong audience": issuer.token(**{**good, "aud": "https://another.example/mcp"}),
        "expired": issuer.token(**good, exp=int(time.time()) - 3600, iat=int(time.time()) - 7200),
        "unsigned (alg none)": unsigned,
        "signed by a foreign key": issuer.token(foreign_key, **good),
        "foreign issuer": issuer.token(**good, iss="http://127.0.0.1:1"),
        "HMAC with the public key (alg confusion)": _hmac_signed(claims, public_pem),
        "no tenant claim": issuer.token(aud=api.resource, scope="ragline:admin"),
        "no role": issuer.token(aud=api.resource, org=tenant, scope="openid profile"),
        "no expiry": issuer.token(**good, exp=None),
        "tampered payload": _tampered(issuer.token(**good)),
    }


def _part(value: dict[str, Any]) -> bytes:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=")


def _hmac_signed(claims: dict[str, Any], secret: bytes) -> str:
    """HS256 with the issuer's public key as the secret, written by hand (PyJWT refuses to)."""
    signed = _part({"alg": "HS256", "kid": "k1", "typ": "JWT"}) + b"." + _part(claims)
    signature = base64.urlsafe_b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).rstrip(b"=")
    return (signed + b"." + signature).decode()


def _tampered(token: str) -> str:
    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["scope"] = "ragline:admin"
    claims["org"] = "victim"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{header}.{forged}.{signature}"


def test_bad_tokens_are_refused_with_a_challenge_naming_the_metadata(api: OAuthApi, issuer: Issuer) -> None:
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t"}},
    }
    accept = {"Accept": "application/json, text/event-stream"}
    refused = []
    with httpx.Client(base_url=api.server.url, timeout=30) as http:
        for case, token in _bad_tokens(api, issuer).items():
            for response in (
                http.get("/v1/kbs", headers=_bearer(token)),
                http.post("/mcp", json=hello, headers={**_bearer(token), **accept}),
            ):
                assert response.status_code == 401, (case, response.request.url, response.text)
                assert response.json()["code"] == "AUTH_ERROR", case
                challenge = response.headers["www-authenticate"]
                assert challenge.startswith("Bearer "), case
                assert f'resource_metadata="{api.metadata_url}"' in challenge, (case, challenge)
                assert 'error="invalid_token"' in challenge, (case, challenge)
                assert token not in response.text
                refused.append(case)
        # Without any credential: the challenge tells the client where to start, no error yet.
        bare = http.get("/v1/kbs")
        assert bare.status_code == 401
        assert (
            bare.headers["www-authenticate"]
            == f'Bearer realm="ragline", resource_metadata="{api.metadata_url}"'
        )
    print(f"refused on REST and MCP: {sorted(set(refused))}")


def test_api_keys_keep_working_beside_tokens(api: OAuthApi) -> None:
    with api.server.client("a_admin") as http:
        assert http.get("/v1/kbs").status_code == 200
    bearer_key = {"Authorization": f"Bearer {api.server.keys['a_read']}"}
    assert httpx.get(f"{api.server.url}/v1/kbs", headers=bearer_key).status_code == 200
    revoked = {"X-Api-Key": api.server.keys["a_revoked"]}
    assert httpx.get(f"{api.server.url}/v1/kbs", headers=revoked).status_code == 401


def test_a_rotated_key_is_fetched_once_and_random_key_ids_do_not_flood_the_issuer(
    api: OAuthApi, issuer: Issuer
) -> None:
    tenant = _tenant()
    claims: dict[str, Any] = {"aud": api.resource, "org": tenant, "scope": "ragline:read"}
    with httpx.Client(base_url=api.server.url, timeout=30) as http:
        assert http.get("/v1/kbs", headers=_bearer(issuer.token(**claims))).status_code == 200
        time.sleep(REFETCH_S + 1)  # past the early-refetch guard: the rotation below is fetched at once
        rotated = SigningKey(kid=f"k-{secrets.token_hex(3)}")
        issuer.keys.append(rotated)
        before = issuer.jwks_fetches
        assert http.get("/v1/kbs", headers=_bearer(issuer.token(rotated, **claims))).status_code == 200
        assert issuer.jwks_fetches == before + 1
        strangers = [SigningKey(kid=f"x-{n}") for n in range(3)]
        for key in strangers * 5:
            assert http.get("/v1/kbs", headers=_bearer(issuer.token(key, **claims))).status_code == 401
        assert issuer.jwks_fetches == before + 1, "unknown key ids made the API ask the issuer again"


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"RAGLINE_AUTH__OAUTH__ISSUER": "http://127.0.0.1:9"}, "RAGLINE_AUTH__OAUTH__RESOURCE is required"),
        (
            {
                "RAGLINE_AUTH__OAUTH__ISSUER": "http://127.0.0.1:9",
                "RAGLINE_AUTH__OAUTH__RESOURCE": "http://127.0.0.1:8000/mcp",
                "RAGLINE_AUTH__OAUTH__ALGORITHMS": '["RS256", "HS256"]',
            },
            "unsupported algorithms ['HS256']",
        ),
    ],
)
def test_oauth_settings_are_checked_at_startup(settings: dict[str, str], problem: str) -> None:
    env = {**os.environ, "RAGLINE_AUTH__ALLOW_ANONYMOUS": "false", **settings}
    done = subprocess.run(
        [RAGLINE, "serve", "--port", str(free_port())],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert problem in done.stderr

"""OAuth 2.1 access tokens: JWTs of the configured issuer, checked against its published keys.

A token is accepted only when its signature verifies with a key of the issuer's JWKS under an
allowed asymmetric algorithm, its `iss` is the issuer, its `aud` names this resource, and it has
not expired; its claims then name the tenant and the role. Anything else is AUTH_ERROR, with a
reason that never repeats the token.

The JWKS is fetched when first needed and kept for `jwks_cache_s`. A token signed with a key id
the cache does not know makes one early fetch (the issuer rotated its keys), at most once per
`jwks_refetch_s`: random key ids must not turn every request into a request to the issuer. The
same guard holds after a failed fetch (the last good keys serve meanwhile), so an issuer that is
down is not asked once per request, and requests do not queue behind one slow fetch after another.
A fetch as a whole has a deadline and a size cap: every token check waits on it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass
from typing import Any, TypeGuard

import httpx
import jwt

from services.core.auth import Principal, Role
from shared.config import OAuthSettings
from shared.errors import ErrorCode, RaglineError

FETCH_TIMEOUT_S = 5.0  # each connect or read
FETCH_DEADLINE_S = 10.0  # the whole fetch: a server that drips bytes never trips a read timeout
MAX_TOKEN_CHARS = 16_384
MAX_JWKS_BYTES = 1 << 20
TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
_ROLE_PREFIX = "ragline:"


def looks_like_jwt(token: str) -> bool:
    """A compact JWS (three base64url parts), which no API key of ours is."""
    parts = token.split(".")
    return len(parts) == 3 and token.startswith("eyJ")


def is_tenant(value: Any) -> TypeGuard[str]:
    """A tenant id as API keys may name one: the whole value matches (re.match's `$` would let a
    trailing newline through, and a tenant that no key can name)."""
    return isinstance(value, str) and re.fullmatch(TENANT_PATTERN, value) is not None


def refused(reason: str) -> RaglineError:
    return RaglineError(f"the access token is not valid: {reason}", code=ErrorCode.AUTH_ERROR)


def role_of(claim: Any) -> Role | None:
    """The highest role a claim grants: "admin", "ragline:write", "openid ragline:read", [..]."""
    if isinstance(claim, str):
        values = claim.split()
    elif isinstance(claim, list):
        values = [v for v in claim if isinstance(v, str)]
    else:
        return None
    roles = [
        Role[name.upper()]
        for value in values
        for name in [value.removeprefix(_ROLE_PREFIX).lower()]
        if name in ("read", "write", "admin")
    ]
    return max(roles, default=None)


@dataclass(frozen=True)
class SigningKey:
    key: jwt.PyJWK
    algorithm: str | None  # the JWK's own `alg`, when it names one


class IssuerKeys:
    """The issuer's signing keys by key id, fetched from its JWKS and cached."""

    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self._keys: dict[str | None, SigningKey] = {}
        self._fetched_at = float("-inf")
        self._attempted_at = float("-inf")  # the last fetch, whether it succeeded or not
        self._unreadable: str | None = None  # why the last fetch failed, until one succeeds
        self._jwks_url = settings.jwks_url
        self._lock = asyncio.Lock()

    async def key(self, kid: str | None) -> SigningKey:
        now = time.monotonic()
        stale = now - self._fetched_at > self.settings.jwks_cache_s
        guard = min(self.settings.jwks_refetch_s, self.settings.jwks_cache_s)
        if (stale or self._find(kid) is None) and now - self._attempted_at > guard:
            async with self._lock:
                if time.monotonic() - self._attempted_at > guard:
                    await self._refresh()
        found = self._find(kid)
        if found is None and not self._keys and self._unreadable is not None:
            raise RaglineError(self._unreadable, code=ErrorCode.UNAVAILABLE)
        if found is None:
            raise refused("it is signed with a key the issuer does not publish")
        return found

    def _find(self, kid: str | None) -> SigningKey | None:
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    async def _refresh(self) -> None:
        self._attempted_at = time.monotonic()
        try:
            async with (
                asyncio.timeout(FETCH_DEADLINE_S),
                httpx.AsyncClient(timeout=FETCH_TIMEOUT_S, follow_redirects=False) as client,
            ):
                if self._jwks_url is None:
                    self._jwks_url = await self._discover(client)
                document = await _json(client, self._jwks_url)
            entries = document.get("keys") if isinstance(document, dict) else None
            if not isinstance(entries, list):
                raise ValueError("the document is no JWKS")
        except (httpx.HTTPError, ValueError, TimeoutError) as error:
            self._unreadable = f"the authorization server's keys cannot be read ({type(error).__name__})"
            if self._keys:
                return  # keep the last good keys while the issuer is unreachable
            raise RaglineError(self._unreadable, code=ErrorCode.UNAVAILABLE) from None
        keys: dict[str | None, SigningKey] = {}
        for entry in entries:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            kid, declared = entry.get("kid"), entry.get("alg")
            if not isinstance(kid, str | None) or not isinstance(declared, str | None):
                continue  # a malformed entry: the others still count
            try:
                keys[kid] = SigningKey(jwt.PyJWK(entry), declared)
            except jwt.PyJWTError:
                continue  # a key type or curve this build cannot use: the others still count
        self._keys = keys
        self._fetched_at = time.monotonic()
        self._unreadable = None

    async def _discover(self, client: httpx.AsyncClient) -> str:
        """The issuer's `jwks_uri`, from its RFC 8414 metadata or its OpenID configuration, when
        that document names the configured issuer exactly (RFC 8414 section 3.3): metadata of
        another issuer, served at a shared host's well-known path, would hand its keys to tokens
        that claim ours."""
        issuer = str(self.settings.issuer).rstrip("/")
        origin, _, path = issuer.partition("://")[2].partition("/")
        scheme = issuer.partition("://")[0]
        candidates = [
            f"{scheme}://{origin}/.well-known/oauth-authorization-server{'/' + path if path else ''}",
            f"{issuer}/.well-known/openid-configuration",
        ]
        for url in candidates:
            try:
                metadata = await _json(client, url)
            except (httpx.HTTPError, ValueError):
                continue
            if not isinstance(metadata, dict) or metadata.get("issuer") != self.settings.issuer:
                continue
            if isinstance(metadata.get("jwks_uri"), str):
                return str(metadata["jwks_uri"])
        raise ValueError("the issuer publishes no jwks_uri in metadata that names it")


async def _json(client: httpx.AsyncClient, url: str) -> Any:
    """The JSON document at `url`, read no further than MAX_JWKS_BYTES (ValueError beyond)."""
    body = bytearray()
    async with client.stream("GET", url, headers={"accept": "application/json"}) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            body.extend(chunk)
            if len(body) > MAX_JWKS_BYTES:
                raise ValueError("the document is too large")
    try:
        return json.loads(body)
    except RecursionError:
        raise ValueError("the document nests too deep") from None


class AccessTokens:
    """Checks a bearer JWT and maps its claims to a principal."""

    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self.keys = IssuerKeys(settings)

    async def principal(self, token: str) -> Principal:
        if len(token) > MAX_TOKEN_CHARS:
            raise refused("it is too long")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise refused("it is not a signed JWT") from None
        algorithm = header.get("alg")
        if algorithm not in self.settings.algorithms:
            raise refused(f"its algorithm is not one of {', '.join(self.settings.algorithms)}")
        kid = header.get("kid")
        signing = await self.keys.key(kid if isinstance(kid, str) else None)
        if signing.algorithm not in (None, algorithm):
            raise refused("its algorithm is not the key's")
        try:
            claims = jwt.decode(
                token,
                key=signing.key,
                algorithms=[algorithm],
                audience=self.settings.audiences,
                issuer=self.settings.issuer,
                leeway=self.settings.leeway_s,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise refused("it has expired") from None
        except jwt.InvalidAudienceError:
            raise refused("it is not meant for this server (aud)") from None
        except jwt.InvalidIssuerError:
            raise refused("it is from another issuer") from None
        except jwt.ImmatureSignatureError:
            raise refused("it is not valid yet") from None
        except jwt.MissingRequiredClaimError as error:
            raise refused(f"it lacks the {error.claim} claim") from None
        except jwt.InvalidSignatureError:
            raise refused("its signature does not verify") from None
        except jwt.DecodeError:
            # A part that is not base64 or JSON, or a time claim that is no number ("exp": "soon"):
            # the token cannot be read, which is not the same as a signature that does not verify.
            raise refused("its claims are malformed") from None
        except jwt.PyJWTError:
            raise refused("its signature does not verify") from None
        return self._principal(claims)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        tenant = claims.get(self.settings.tenant_claim)
        if not is_tenant(tenant):
            raise refused(f"its {self.settings.tenant_claim} claim names no valid tenant")
        role = role_of(claims.get(self.settings.role_claim))
        if role is None and self.settings.default_role is not None:
            role = Role[self.settings.default_role.upper()]
        if role is None:
            raise refused(f"its {self.settings.role_claim} claim grants no Ragline role")
        subject = claims.get("sub")
        name = f"oauth:{subject}" if isinstance(subject, str) else "oauth"
        return Principal(tenant, role, name[:200])

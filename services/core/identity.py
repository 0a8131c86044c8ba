"""Who calls over HTTP, for both fronts: an API key, or an OAuth access token when an issuer is set.

A refusal is 401 AUTH_ERROR with a `WWW-Authenticate: Bearer` challenge (RFC 6750). With OAuth on,
the challenge names the protected-resource metadata (RFC 9728), which is where an MCP client
learns which authorization server to get a token from (the MCP authorization spec).
"""

from __future__ import annotations

from urllib.parse import urlsplit

from mcp.shared.auth import ProtectedResourceMetadata
from pydantic import AnyHttpUrl
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.core.access_tokens import AccessTokens, looks_like_jwt
from services.core.auth import KeyRing, Principal, key_from_headers
from services.core.envelope import envelope
from shared.config import OAuthSettings
from shared.errors import ErrorCode, RaglineError

WELL_KNOWN = "/.well-known/oauth-protected-resource"


def metadata_path(resource: str) -> str:
    """RFC 9728 section 3.1: the well-known prefix inserted before the resource's path."""
    path = urlsplit(resource).path.rstrip("/")
    return f"{WELL_KNOWN}{path}"


class Authenticator:
    """Resolves the caller of a request from its headers alone (no body is read before it)."""

    def __init__(self, keys: KeyRing, oauth: OAuthSettings) -> None:
        self.keys = keys
        self.oauth = oauth
        self.tokens = AccessTokens(oauth) if oauth.enabled else None
        self.metadata_url: str | None = None
        if oauth.resource is not None and oauth.enabled:
            parts = urlsplit(oauth.resource)
            self.metadata_url = f"{parts.scheme}://{parts.netloc}{metadata_path(oauth.resource)}"

    async def principal(self, headers: Headers) -> Principal:
        authorization = headers.get("authorization")
        presented = key_from_headers(authorization, headers.get("x-api-key"))
        if (
            self.tokens is not None
            and self.keys.anonymous is None
            and not headers.get("x-api-key")
            and presented is not None
            and looks_like_jwt(presented)
        ):
            return await self.tokens.principal(presented)
        return self.keys.principal(presented)

    def refusal(self, error: RaglineError, headers: Headers) -> JSONResponse:
        """The error's envelope; a 401 carries the challenge that says how to authenticate."""
        challenge = None
        if error.code == ErrorCode.AUTH_ERROR:
            params = ['realm="ragline"']
            if self.metadata_url is not None:
                params.append(f'resource_metadata="{self.metadata_url}"')
            if headers.get("authorization") or headers.get("x-api-key"):
                description = error.message.replace('"', "'")
                params.append(f'error="invalid_token", error_description="{description}"')
            challenge = {"WWW-Authenticate": "Bearer " + ", ".join(params)}
        return envelope(error.code, error.message, error.details, headers=challenge)

    def metadata_routes(self) -> list[Route]:
        """The protected-resource metadata, at the resource's well-known path and at the root one
        (clients that know only the origin look there); none while OAuth is off."""
        if self.tokens is None or self.oauth.resource is None:
            return []
        metadata = ProtectedResourceMetadata(
            resource=AnyHttpUrl(self.oauth.resource),
            authorization_servers=[AnyHttpUrl(str(self.oauth.issuer))],
            scopes_supported=self.oauth.scopes_supported,
            bearer_methods_supported=["header"],
            resource_signing_alg_values_supported=None,
            resource_name="Ragline",
        )
        body = metadata.model_dump(mode="json", exclude_none=True)
        # As configured, not as pydantic normalises a URL (it adds a trailing slash): clients
        # compare the issuer identifier exactly (RFC 8414 section 3.3).
        body["resource"] = self.oauth.resource
        body["authorization_servers"] = [self.oauth.issuer]

        async def serve(_: Request) -> Response:
            return JSONResponse(body, headers={"Cache-Control": "public, max-age=3600"})

        paths = dict.fromkeys([metadata_path(self.oauth.resource), WELL_KNOWN])
        return [Route(path, serve, methods=["GET", "HEAD"]) for path in paths]

"""Authentication in front of the REST routes: the key is checked before anything reads the body.

FastAPI reads and parses a route's JSON body before it runs the route's dependencies, so a caller
without a key could make the API hold any body up to the request limit only to be refused. This
gate resolves the caller of every /v1 request from its headers alone (an API key or an OAuth
access token, services/core/identity.py) and refuses AUTH_ERROR at
once; the route dependencies (services/api/deps.py) take the principal it resolved, and check roles.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from services.core.auth import Principal
from services.core.identity import Authenticator
from shared.errors import RaglineError

PREFIX = "/v1/"
_STATE_KEY = "principal"


def is_rest(scope: Scope) -> bool:
    """A request to the REST API proper (not a probe, the metrics, the docs or /mcp)."""
    path: str = scope["path"]
    return path.startswith(PREFIX) or path == PREFIX.rstrip("/")


def resolved(scope: Scope) -> Principal | None:
    """The principal the gate resolved for this request, if it did."""
    principal: Principal | None = scope.get("state", {}).get(_STATE_KEY)
    return principal


class AuthGate:
    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_rest(scope):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            principal = await self.auth.principal(headers)
        except RaglineError as error:
            await self.auth.refusal(error, headers)(scope, receive, send)
            return
        scope.setdefault("state", {})[_STATE_KEY] = principal
        await self.app(scope, receive, send)

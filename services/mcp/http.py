"""MCP over HTTP: streamable HTTP at the configured path and SSE beside it, authenticated as the
REST API is (API keys or OAuth access tokens), fail closed. The API mounts these routes; `ragline
mcp --transport` serves them alone (services/mcp/standalone.py)."""

from __future__ import annotations

from typing import Any, Literal

from mcp.server.fastmcp import FastMCP
from mcp.server.sse import SseServerTransport
from mcp.server.transport_security import TransportSecurityMiddleware
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.core.identity import Authenticator
from services.mcp.sdk_patches import limit_sse_posts, low_level_server
from services.mcp.sessions import EnvelopeBodyLimit, install_sessions, owner
from services.mcp.sse_idle import run_until_idle
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError


class KeyGate:
    """Authenticates every MCP HTTP request as the REST API does before MCP sees it."""

    def __init__(self, app: ASGIApp, auth: Authenticator) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        try:
            principal = await self.auth.principal(headers)
        except RaglineError as error:
            await self.auth.refusal(error, headers)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        scope["user"] = owner(principal)  # what the SDK binds a session to (services/mcp/sessions.py)
        await self.app(scope, receive, send)


Transport = Literal["streamable-http", "sse"]


class PostsOnly:
    """Stateless streamable HTTP answers only POSTs: a GET would open a stream no message can ever
    reach (there is no session to send on), held for as long as the client likes; the spec's
    answer to a GET a server does not serve is 405."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] != "POST":
            response = JSONResponse(
                status_code=405,
                content={
                    "code": ErrorCode.INVALID_ARGUMENT.value,
                    "message": "stateless MCP takes POSTs only (RAGLINE_MCP__STATELESS)",
                    "details": {},
                },
                headers={"Allow": "POST"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def mcp_routes(
    mcp: FastMCP[Any],
    auth: Authenticator,
    settings: Settings,
    transports: tuple[Transport, ...] = ("streamable-http", "sse"),
) -> list[Route | Mount]:
    """Streamable HTTP at the MCP path (/mcp), and SSE (older clients) at <path>/sse with posts to
    <path>/messages/; the protected-resource metadata when OAuth is on.

    The caller must run `mcp.session_manager.run()` in its lifespan.
    """
    path = settings.mcp.path
    sessions = install_sessions(mcp, settings)
    sse = SseServerTransport(
        f"{path}/messages/",
        security_settings=mcp.settings.transport_security,
        max_request_body_size=settings.mcp_request_limit,
    )
    # The SDK answers an oversized post to a session as plain text; ours say TOO_LARGE as JSON.
    limit_sse_posts(sse, EnvelopeBodyLimit, settings.mcp_request_limit)
    server = low_level_server(mcp)  # the SDK's own sse_app() runs the low-level server the same way

    security = TransportSecurityMiddleware(mcp.settings.transport_security)

    async def handle_sse(scope: Scope, receive: Receive, send: Send) -> None:
        # connect_sse answers a bad Host or Origin and then raises, which drops the connection
        # and logs a stack trace: answer it here first.
        refusal = await security.validate_request(Request(scope, receive), is_post=False)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        tenant = scope["state"]["principal"].tenant
        # An SSE session lives as long as its stream: it counts against the tenant's cap beside
        # its streamable-HTTP sessions, and leaves it when the stream ends.
        if sessions.open_sessions(tenant) >= sessions.per_tenant:
            await sessions.refusal()(scope, receive, send)
            return
        with sessions.holding(tenant):
            async with sse.connect_sse(scope, receive, send) as (read, write):
                await run_until_idle(server, read, write, settings.mcp.session_idle_s)

    routes: list[Route | Mount] = [*auth.metadata_routes()]
    if "streamable-http" in transports:
        handler: ASGIApp = sessions.handle_request
        if settings.mcp.stateless:
            handler = PostsOnly(handler)
        routes.append(_Labelled(path, endpoint=KeyGate(handler, auth)))
    if "sse" in transports:
        routes.append(_Labelled(f"{path}/sse", endpoint=KeyGate(handle_sse, auth)))
        routes.append(_LabelledMount(f"{path}/messages/", app=KeyGate(sse.handle_post_message, auth)))
    return routes


def _named(route: BaseRoute, found: tuple[Match, Scope]) -> tuple[Match, Scope]:
    """The route names itself in the scope, as FastAPI's do: the request metrics' route label."""
    match, child = found
    if match != Match.NONE:
        child["route"] = route
    return match, child


class _Labelled(Route):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return _named(self, super().matches(scope))


class _LabelledMount(Mount):
    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        return _named(self, super().matches(scope))

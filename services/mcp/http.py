"""Streamable HTTP for the MCP server inside the API: same port, same API keys, fail closed."""

from __future__ import annotations

from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.sse import SseServerTransport
from mcp.server.transport_security import TransportSecurityMiddleware
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import BaseRoute, Match, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.core.auth import KeyRing, key_from_headers
from services.core.envelope import envelope
from services.mcp.sdk_patches import limit_sse_posts, low_level_server
from services.mcp.sessions import EnvelopeBodyLimit, install_sessions, owner
from shared.config import ApiSettings
from shared.errors import RaglineError


class KeyGate:
    """Authenticates every MCP HTTP request with the REST API keys before MCP sees it."""

    def __init__(self, app: ASGIApp, keys: KeyRing) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        try:
            principal = self.keys.principal(
                key_from_headers(headers.get("authorization"), headers.get("x-api-key"))
            )
        except RaglineError as error:
            await envelope(error.code, error.message)(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal
        scope["user"] = owner(principal)  # what the SDK binds a session to (services/mcp/sessions.py)
        await self.app(scope, receive, send)


def mcp_routes(mcp: FastMCP[Any], keys: KeyRing, api: ApiSettings) -> list[Route | Mount]:
    """Streamable HTTP at /mcp, and SSE (older clients) at /mcp/sse with posts to /mcp/messages/.

    The caller must run `mcp.session_manager.run()` in its lifespan.
    """
    sessions = install_sessions(mcp, api)
    sse = SseServerTransport(
        "/mcp/messages/",
        security_settings=mcp.settings.transport_security,
        max_request_body_size=api.mcp_request_limit,
    )
    # The SDK answers an oversized post to a session as plain text; ours say TOO_LARGE as JSON.
    limit_sse_posts(sse, EnvelopeBodyLimit, api.mcp_request_limit)
    server = low_level_server(mcp)  # the SDK's own sse_app() runs the low-level server the same way

    security = TransportSecurityMiddleware(mcp.settings.transport_security)

    async def handle_sse(scope: Scope, receive: Receive, send: Send) -> None:
        # connect_sse answers a bad Host or Origin and then raises, which drops the connection
        # and logs a stack trace: answer it here first.
        refusal = await security.validate_request(Request(scope, receive), is_post=False)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        async with sse.connect_sse(scope, receive, send) as (read, write):
            await server.run(read, write, server.create_initialization_options())

    return [
        _Labelled("/mcp", endpoint=KeyGate(sessions.handle_request, keys)),
        _Labelled("/mcp/sse", endpoint=KeyGate(handle_sse, keys)),
        _LabelledMount("/mcp/messages/", app=KeyGate(sse.handle_post_message, keys)),
    ]


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

"""Streamable HTTP for the MCP server inside the API: same port, same API keys, fail closed."""

from __future__ import annotations

from mcp.server.fastmcp.server import StreamableHTTPASGIApp
from starlette.datastructures import Headers
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from services.api.auth import KeyRing, key_from_headers
from services.api.errors import envelope
from services.mcp.server import RaglineMCP
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
        await self.app(scope, receive, send)


def mcp_routes(mcp: RaglineMCP, keys: KeyRing) -> list[Route]:
    """The /mcp route; the caller must run `mcp.session_manager.run()` in its lifespan."""
    mcp.streamable_http_app()  # creates the session manager
    return [Route("/mcp", endpoint=KeyGate(StreamableHTTPASGIApp(mcp.session_manager), keys))]

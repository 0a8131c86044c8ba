"""`ragline mcp --transport sse|streamable-http`: the MCP server as a process of its own.

The same tools, limits and authentication as the API's MCP mount, without the REST API: for
deployments that scale or expose the agent front apart from REST. It answers `/healthz` for load
balancers; everything else is the MCP routes (services/mcp/http.py).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.core import http_server
from services.core.container import build_state
from services.core.slow_clients import BodyRate
from services.mcp.http import Transport, mcp_routes
from services.mcp.server import build_mcp
from shared import logs
from shared.config import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings, transport: Transport) -> Starlette:
    """The MCP routes of one transport, and a liveness probe."""
    state = build_state(settings)
    assert state.auth is not None
    mcp = build_mcp(state)
    routes = mcp_routes(mcp, state.auth, settings, transports=(transport,))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        try:
            state.prepare_indexes()
        except Exception as error:  # noqa: BLE001  (serve anyway; each tool call says what is down)
            log.warning("could not prepare the indexes yet: %s", type(error).__name__)
        async with mcp.session_manager.run():
            yield

    async def healthz(_: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    paced = Middleware(BodyRate, api=settings.api)
    return Starlette(
        routes=[Route("/healthz", healthz, methods=["GET", "HEAD"]), *routes],
        middleware=[paced],
        lifespan=lifespan,
    )


def serve_http(settings: Settings, transport: Transport, host: str, port: int) -> None:
    """Serve MCP over `transport` on host:port until stopped."""
    logs.configure("mcp", settings.log_level, settings.log_format, logs.secret_values(settings))
    http_server.run(create_app(settings, transport), settings, host, port)

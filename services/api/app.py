"""The FastAPI application: REST under /v1, health, metrics, OpenAPI."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api import errors
from services.api.auth_gate import AuthGate, is_rest
from services.api.host_check import HostCheck
from services.api.kb_path import KbPathCheck
from services.api.metrics import Metrics, RequestLatency
from services.api.readiness import Readiness
from services.api.request_context import RequestContext
from services.api.routes import batches, chunks, documents, health, kbs, search, sources
from services.api.upload_body import is_json_upload
from services.core.buffer_budget import BUDGET
from services.core.container import AppState, build_state
from services.core.envelope import envelope
from services.core.slow_clients import BodyRate
from services.mcp.http import mcp_routes
from services.mcp.server import build_mcp
from shared import VERSION
from shared.config import ApiSettings, Settings, get_settings
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)


# The one REST route that takes big bodies: document uploads (files, or inline content).
_UPLOAD = re.compile(r"^/v1/kbs/[^/]+/documents/?$")


def body_limits(api: ApiSettings) -> Callable[[Scope], int]:
    """The body limit of a request: small for every /v1 route but uploads; a JSON upload, which
    the route reads and parses whole, gets room for one file as text and its metadata."""

    def limit(scope: Scope) -> int:
        if is_rest(scope) and not (scope["method"] == "POST" and _UPLOAD.match(scope["path"])):
            return api.max_json_bytes
        content_type = Headers(raw=scope.get("headers", [])).get("content-type", "")  # the route's: the first
        if is_rest(scope) and is_json_upload(content_type):
            return api.json_upload_limit
        return api.max_request_bytes

    return limit


def held_whole(scope: Scope) -> bool:
    """Whether the route reads the body whole before it parses it: a JSON upload. (An MCP message
    is too, counted by the MCP app's own limit, services/mcp/sessions.py.)"""
    content_type = Headers(raw=scope.get("headers", [])).get("content-type", "")
    return (
        is_rest(scope)
        and scope["method"] == "POST"
        and bool(_UPLOAD.match(scope["path"]))
        and is_json_upload(content_type)
    )


class BodyLimit:
    """Refuses request bodies over the request's limit while they stream in, declared length or not;
    a body read whole is held in the process's budget (services/core/buffer_budget.py) meanwhile."""

    def __init__(self, app: ASGIApp, limits: Callable[[Scope], int]) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(limit, scope, receive, send)
            return
        received = 0
        responded = False
        whole = held_whole(scope)

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                part = len(message.get("body", b""))
                if whole:
                    BUDGET.take(part, received)  # UNAVAILABLE past it, answered by the route's handler
                received += part
                if received > limit:
                    raise RaglineError(
                        f"the request exceeds {limit} bytes",
                        code=ErrorCode.TOO_LARGE,
                        details={"limit": limit},
                    )
            return message

        async def watched(message: Message) -> None:
            nonlocal responded
            if received > limit:
                # Whatever the app makes of the error (FastAPI answers a body it could not read
                # with its own 400), the answer is TOO_LARGE.
                if not responded:
                    responded = True
                    await self._refuse(limit, scope, receive, send)
                return
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            # A middleware in between (BaseHTTPMiddleware runs the app in a task group) may wrap
            # the error above so no handler knows it; the count tells what happened.
            if received <= limit or responded:
                raise
            await self._refuse(limit, scope, receive, send)
        finally:
            if whole:
                BUDGET.give(received)

    @staticmethod
    async def _refuse(limit: int, scope: Scope, receive: Receive, send: Send) -> None:
        response = envelope(ErrorCode.TOO_LARGE, f"the request exceeds {limit} bytes", {"limit": limit})
        await response(scope, receive, send)


def create_app(settings: Settings | None = None, state: AppState | None = None) -> FastAPI:
    """Build the API; fails at once when auth is not configured (it fails closed)."""
    settings = settings or get_settings()
    state = state or build_state(settings)
    assert state.auth is not None
    mcp = build_mcp(state)
    routes = mcp_routes(mcp, state.auth, settings) if settings.mcp.enabled else state.auth.metadata_routes()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            state.prepare_indexes()
        except Exception as error:  # noqa: BLE001  (serve anyway; /readyz tells what is missing)
            log.warning("could not prepare the indexes yet: %s", type(error).__name__)
        if not settings.mcp.enabled:
            yield
            return
        async with mcp.session_manager.run():
            yield

    app = FastAPI(
        title="Ragline",
        version=VERSION,
        lifespan=lifespan,
        description="Ingestion and hybrid (BM25 + k-NN) retrieval for AI agents. "
        "Every error is `{code, message, details}`.",
    )
    app.state.ragline = state
    app.state.metrics = Metrics(state)
    app.state.readiness = Readiness(state)
    errors.install(app)
    routers = (kbs, documents, chunks, sources, batches, search, health)
    for router in (module.router for module in routers):
        app.include_router(router)
    app.router.routes.extend(routes)
    # Each added one wraps those before it. Inward from the request id: timing (refusals too),
    # the Host/Origin check, the key (before any body is read), the body's limit.
    app.add_middleware(BodyLimit, limits=body_limits(settings.api))
    app.add_middleware(KbPathCheck)  # the KB id as sent, before routing decodes it
    app.add_middleware(AuthGate, auth=state.auth)
    security = mcp.settings.transport_security  # the /mcp check's lists (services/mcp/server.py)
    assert security is not None
    app.add_middleware(HostCheck, security=security)
    app.add_middleware(RequestLatency, metrics=app.state.metrics)
    app.add_middleware(BodyRate, api=settings.api)
    app.add_middleware(RequestContext)  # added last: outermost, so even a refused body gets an id
    return app


def app_factory() -> Any:
    """Entry point for `uvicorn --factory`."""
    return create_app()

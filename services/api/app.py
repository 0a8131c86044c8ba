"""The FastAPI application: REST under /v1, health, metrics, OpenAPI."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.api import errors
from services.api.metrics import Metrics, RequestLatency
from services.api.request_context import RequestContext
from services.api.routes import batches, documents, health, kbs, search
from services.api.state import AppState, build_state, prepare_indexes
from services.mcp.http import mcp_routes
from services.mcp.server import build_mcp
from shared.config import Settings, get_settings
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)


class BodyLimit:
    """Refuses request bodies over the limit while they stream in, declared length or not."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refuse(scope, receive, send)
            return
        received = 0
        responded = False

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise RaglineError(
                        f"the request exceeds {self.limit} bytes",
                        code=ErrorCode.TOO_LARGE,
                        details={"limit": self.limit},
                    )
            return message

        async def watched(message: Message) -> None:
            nonlocal responded
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:
            # A middleware in between (BaseHTTPMiddleware runs the app in a task group) may wrap
            # the error above so no handler knows it; the count tells what happened.
            if received <= self.limit or responded:
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = errors.envelope(
            ErrorCode.TOO_LARGE, f"the request exceeds {self.limit} bytes", {"limit": self.limit}
        )
        await response(scope, receive, send)


def create_app(settings: Settings | None = None, state: AppState | None = None) -> FastAPI:
    """Build the API; fails at once when auth is not configured (it fails closed)."""
    settings = settings or get_settings()
    state = state or build_state(settings)
    assert state.keys is not None
    mcp = build_mcp(state)
    routes = mcp_routes(mcp, state.keys, settings.api)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            prepare_indexes(state)
        except Exception as error:  # noqa: BLE001  (serve anyway; /readyz tells what is missing)
            log.warning("could not prepare the indexes yet: %s", type(error).__name__)
        async with mcp.session_manager.run():
            yield

    app = FastAPI(
        title="Ragline",
        version="0.1.0",
        lifespan=lifespan,
        description="Ingestion and hybrid (BM25 + k-NN) retrieval for AI agents. "
        "Every error is `{code, message, details}`.",
    )
    app.state.ragline = state
    app.state.metrics = Metrics(state)
    errors.install(app)
    for router in (kbs.router, documents.router, batches.router, search.router, health.router):
        app.include_router(router)
    app.router.routes.extend(routes)
    app.add_middleware(RequestLatency, metrics=app.state.metrics)
    app.add_middleware(BodyLimit, limit=settings.api.max_request_bytes)
    app.add_middleware(RequestContext)  # added last: outermost, so even a refused body gets an id
    return app


def app_factory() -> Any:
    """Entry point for `uvicorn --factory`."""
    return create_app()

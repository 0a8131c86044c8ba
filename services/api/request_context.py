"""Gives each HTTP request an id for its log lines and span, from X-Request-ID or made, and echoes it."""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import logs, tracing

HEADER = "X-Request-ID"
# A caller's id goes into every log line of the request: only a short, plain token is taken as is.
_ACCEPTED = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id(scope: Scope) -> str:
    given = dict(scope["headers"]).get(HEADER.lower().encode(), b"").decode("latin-1")
    return given if _ACCEPTED.match(given) else uuid.uuid4().hex


class RequestContext:
    """Outermost middleware: every line logged while serving the request carries its id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope)
        # FastAPI's own OpenTelemetry middleware wraps the whole app: its request span is current here.
        tracing.annotate(request_id=rid)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = rid
            await send(message)

        with logs.bound(request_id=rid):
            await self.app(scope, receive, send_with_id)

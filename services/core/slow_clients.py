"""Bounds on clients that send slowly: a request's headers within a time, its body at a least rate.

uvicorn's HTTP/1.1 server waits for a request's headers and body as long as the client keeps the
connection open, so connections that drip a byte now and then are held for good (slowloris):
each holds a file descriptor, and one with a body its request's task and buffers. Two bounds, in
the manner of nginx's `client_header_timeout` and Kestrel's minimum request body data rate:

- `header_timeout`: a connection that has not sent a whole request line and headers this long
  after it opened (or after the first byte of its next request) is closed.
- `BodyRate`: after a grace period a request body must keep a least rate, its bytes earning
  silence up to an idle bound (nginx's `client_body_timeout`) and no more: a burst would
  otherwise buy hours of silence at the rate, or of a trickle of a byte now and then. A body
  that falls behind is answered `REQUEST_TIMEOUT` (408) and its connection closed. A rate rather
  than a total time, so a large upload over a slow link passes while it keeps moving. Only the
  time the app waits for the client counts: while the app is busy between reads (storing a
  part), the server stops reading and the client cannot send.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from services.core.envelope import envelope
from shared.config import ApiSettings
from shared.errors import ErrorCode

log = logging.getLogger(__name__)


def header_timeout(seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers take over `seconds`."""

    class HeaderTimeout(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _awaited: object = None  # the cycle current when the timer was set: a new one means headers came

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_headers()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._await_headers()  # the first byte of the next request (or of a body left unread)
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not self._awaited:
                self._stop_timer()  # the headers are in: the body's pace is BodyRate's

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        def _stop_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _await_headers(self) -> None:
            self._awaited = self.cycle

            def expire() -> None:
                self._header_timer = None
                if self.cycle is self._awaited and not self.transport.is_closing():
                    log.info("closed a connection whose request headers took over %ss", seconds)
                    self.transport.close()

            self._header_timer = self.loop.call_later(seconds, expire)

    return HeaderTimeout


class BodyRate:
    """ASGI middleware: a request body must arrive at `body_min_bytes_per_s` on average after
    `body_grace_s`, with no wait for its next bytes over `body_idle_s`.

    Only the reads of the body are timed: once it is whole, a read waits for the client to leave
    (a streaming response listens that way) and is passed on untouched.
    """

    def __init__(self, app: ASGIApp, *, api: ApiSettings) -> None:
        self.app = app
        self.grace_s = api.body_grace_s
        self.min_bytes_per_s = api.body_min_bytes_per_s
        self.idle_s = api.body_idle_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        received = 0
        # Seconds the client may still stay silent: the grace to start, then what its bytes earn at
        # the least rate, never more than the idle bound (a burst buys no hours of silence, nor a
        # trickle a byte at a time after one). Only time waiting for the client is charged: an app
        # busy between its reads is not the client.
        credit = min(self.grace_s, self.idle_s)
        whole = False
        refused = False
        responded = False

        async def timed(message: Message) -> None:
            nonlocal responded
            if refused:
                return  # the client was answered 408: whatever the app says next goes nowhere
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        async def paced() -> Message:
            nonlocal received, credit, whole, refused
            if refused:
                return {"type": "http.disconnect"}
            if whole:
                return await receive()
            began = loop.time()
            try:
                # Never 0: asyncio.wait_for gives up at once then, on data already buffered too.
                message: Message = await asyncio.wait_for(receive(), timeout=max(credit, 0.01))
            except TimeoutError:
                refused = True
                why = (
                    f"the request body paused over {self.idle_s:g} s"
                    if credit >= self.idle_s
                    else f"the request body arrived slower than {self.min_bytes_per_s} bytes a second"
                )
                await self._refuse(why, received, responded, scope, receive, send)
                return {"type": "http.disconnect"}
            credit -= loop.time() - began
            if message["type"] == "http.request":
                part = len(message.get("body", b""))
                received += part
                credit = min(credit + part / self.min_bytes_per_s, self.idle_s)
                whole = not message.get("more_body", False)
            return message

        await self.app(scope, paced, timed)

    async def _refuse(
        self, why: str, received: int, responded: bool, scope: Scope, receive: Receive, send: Send
    ) -> None:
        log.info("refused a request: %s (%d bytes read)", why, received)
        if responded:
            return  # the app already answered; the disconnect it now reads ends it
        details: dict[str, Any] = {
            "received_bytes": received,
            "min_bytes_per_s": self.min_bytes_per_s,
            "idle_s": self.idle_s,
        }
        response = envelope(ErrorCode.REQUEST_TIMEOUT, why, details, headers={"Connection": "close"})
        await response(scope, receive, send)

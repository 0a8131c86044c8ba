"""Streamable-HTTP sessions bound to the key that opened them, a cap per tenant, a body limit.

The SDK binds a session to `scope["user"]` when that is an `AuthenticatedUser`: a request for a
session from another identity is answered 404, exactly as an unknown session, so an id is never
confirmed. `KeyGate` puts the principal there as such a user (tenant and key, see `owner`).

A tenant that holds `RAGLINE_MCP__SESSIONS_PER_TENANT` open sessions (streamable HTTP and SSE
streams together) gets RATE_LIMITED (429) for another one, and other tenants are unaffected.
Refused rather than evicting that tenant's oldest idle session: an agent's session sits idle
between its tool calls most of its life, so evicting "idle" ones would end live conversations of
the same tenant without a word, while a refusal is seen by the client that asked; abandoned
sessions still end by the idle timeout or a DELETE. The SDK itself refuses (503) at its
process-wide cap, for the same reason.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, AuthorizationContext
from mcp.server.auth.provider import AccessToken
from mcp.server.fastmcp import FastMCP
from mcp.server.lowlevel.server import Server as MCPServer
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.types import INVALID_REQUEST, PARSE_ERROR
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from services.core.auth import Principal
from services.core.buffer_budget import BUDGET, RETRY_AFTER_S
from services.core.envelope import envelope
from services.mcp.sdk_patches import PerRequestSessions, install_session_manager
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError


def owner(principal: Principal) -> AuthenticatedUser:
    """The identity the SDK compares to a session's creator: tenant, role and key name."""
    token = AccessToken(
        token="",  # never the key: only who it is matters here
        client_id=principal.tenant,
        scopes=[],
        subject=f"{principal.role.name.lower()}:{principal.name}",
    )
    return AuthenticatedUser(token)


# Deeper than any MCP message nests, and well inside the recursion the SDK's JSON parser has left.
MAX_JSON_DEPTH = 128
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
# Python refuses to read an integer of more digits (sys.int_info.str_digits_check_threshold is the
# least it may be set to): the SDK's parser raised past its error handling, a 500.
MAX_NUMBER_DIGITS = 4300
# Tried only where a run of digits starts: from every digit of a run it was quadratic, and a body
# of long runs held the event loop for seconds.
_LONG_NUMBER = re.compile(rf"(?<!\d)\d{{{MAX_NUMBER_DIGITS + 1}}}")
_BRACKET = re.compile(r"[\[\]{}]")
REQUEST_CHECK_BYTES = 1 << 20
# Strings a large body's skeleton keeps: an id, a method, a name is shorter.
SKELETON_STRING_CHARS = 1024
# Where a JSON string may hold a surrogate code point: checked for a lone one only then.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def unparseable(body: bytes) -> str | None:
    """Why the SDK's parser would crash on `body` (not UTF-8, nested too deep, a number too long
    for Python to read), or None.

    The SDK answers other malformed JSON with a JSON-RPC parse error itself; these two raise
    past it (a 500 and a stack trace in the log).
    """
    try:
        return _crash(body.decode("utf-8"))
    except UnicodeDecodeError:
        return "the body is not UTF-8"


def _crash(text: str) -> str | None:
    outside_strings = _STRING.sub("", text)
    depth = 0
    for bracket in _BRACKET.finditer(outside_strings):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            return f"the JSON nests deeper than {MAX_JSON_DEPTH} levels"
    if _LONG_NUMBER.search(outside_strings):
        return f"a number of more than {MAX_NUMBER_DIGITS} digits"
    return None


def _skeleton(text: str) -> str:
    """The JSON with its long strings emptied (an ingest's content, most of a large body): its
    structure, numbers, literals and short strings (ids, methods, names) as they were."""
    return _STRING.sub(_short_or_emptied, text)


def _short_or_emptied(found: re.Match[str]) -> str:
    """A short string as it is; a long one read (ValueError where it holds a raw control character
    or a bad escape, as the SDK's parser would) and emptied, or, where it holds a lone surrogate,
    made a short string that does, which the check after parsing refuses wherever it sits."""
    literal = found.group()
    if len(literal) <= SKELETON_STRING_CHARS:
        return literal
    try:
        json.loads(literal).encode("utf-8")
    except UnicodeEncodeError:
        return '"\\udfff"'
    return '""'


def rejection(body: bytes) -> tuple[int, str] | None:
    """The JSON-RPC error (code, message) a POSTed body gets before the SDK sees it, or None.

    A body the SDK's parser would crash on gets a parse error (see `unparseable`); so does
    malformed JSON, NaN, Infinity or a number past a float's range (the SDK carried the id
    "server-error", or read them as numbers that passed every bound), and a string with a lone
    surrogate. A message the SDK cannot answer gets Invalid Request (see `invalid_request`). Both
    come with a null id and quote nothing that was sent. A body over `REQUEST_CHECK_BYTES` (an
    ingest's content) is checked on its skeleton, its long strings emptied: on the event loop, a
    second parse of 100 MB held every request for most of a second. What its long strings hold
    is the tool's to check (`tools.py` `_payload`).
    """
    try:
        text = body.decode("utf-8-sig")  # a BOM is let by, as JSON parsers read bytes
    except UnicodeDecodeError:
        return PARSE_ERROR, "Parse error: the body is not UTF-8"
    if (reason := _crash(text)) is not None:
        return PARSE_ERROR, f"Parse error: {reason}"
    try:
        if len(body) > REQUEST_CHECK_BYTES:
            text = _skeleton(text)
        message = json.loads(text, parse_constant=_no_json_number, parse_float=_finite)
    except ValueError as error:
        return PARSE_ERROR, f"Parse error: {error}"
    if _SURROGATE_ESCAPE.search(text) and _lone_surrogate(message):
        return PARSE_ERROR, "Parse error: a string holds a lone surrogate, which is no Unicode text"
    if (reason := invalid_request(message)) is not None:
        return INVALID_REQUEST, f"Invalid Request: {reason}"
    return None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is past the range of a number")
    return value


def _no_json_number(name: str) -> object:
    """NaN and Infinity are no JSON (RFC 8259); Python's parsers, the SDK's too, read them as
    floats, and a NaN then passed numeric bounds unnoticed."""
    raise ValueError(f"{name} is not a JSON number")


def _lone_surrogate(value: object) -> bool:
    """Whether a parsed JSON value holds a string with a lone surrogate (keys included)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_lone_surrogate(k) or _lone_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_lone_surrogate(v) for v in value)
    return False


def invalid_request(message: object) -> str | None:
    """Why a parsed body is no JSON-RPC message the SDK would answer, or None.

    The SDK took a request whose id is null, an object or a fraction for a notification (202, and
    the client waited for an answer that never came), and answered a batch (which MCP no longer
    has), a body that is no object, and an object that is no JSON-RPC 2.0 message, with a
    validation error quoting the input (values a client sent, its secrets perhaps) under the id
    "server-error".
    """
    if isinstance(message, list):
        return "batches are not supported; send one message a request"
    if not isinstance(message, dict):
        return "a message is a JSON object"
    if message.get("jsonrpc") != "2.0":
        return 'a message has "jsonrpc": "2.0"'
    # JSON-RPC lets a client's error answer carry a null id; the SDK takes none (it answered 400
    # with a validation error quoting the input), so this says why instead.
    if "id" in message:
        request_id = message["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, str | int):
            return "the id must be a string or an integer"
    if "method" in message:
        if not isinstance(message["method"], str):
            return "the method must be a string"
        if "params" in message and not isinstance(message["params"], dict):
            return "the params must be an object"
        if "result" in message or "error" in message:
            return "a request or a notification carries no result or error"
        return None
    if "id" not in message or ("result" in message) == ("error" in message):
        return "a message is a request, a notification or a response with its id and a result or an error"
    if "result" in message:
        return None if isinstance(message["result"], dict) else "a result must be an object"
    return _error_object_problem(message["error"])


def _error_object_problem(error: object) -> str | None:
    """Why a client's error answer is no JSON-RPC error object (an integer code and a string
    message), or None; the SDK answered those with its validation error, quoting the input."""
    if not isinstance(error, dict):
        return "an error answer's error must be an object"
    code = error.get("code")
    if isinstance(code, bool) or not isinstance(code, int):
        return "an error's code must be an integer"
    if not isinstance(error.get("message"), str):
        return "an error's message must be a string"
    return None


def jsonrpc_error(code: int, message: str) -> JSONResponse:
    """A JSON-RPC error without a request id, answered 400 as the SDK answers malformed JSON."""
    error = {"code": code, "message": message}
    return JSONResponse(status_code=400, content={"jsonrpc": "2.0", "id": None, "error": error})


class EnvelopeBodyLimit(RequestBodyLimitMiddleware):
    """The SDK's body limit (the body is read whole before the app), answering TOO_LARGE as JSON.

    The SDK answers a plain-text 413; every other Ragline error is `{code, message, details}`.
    A body that is no JSON-RPC message the SDK would answer gets a JSON-RPC error (see `rejection`).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_size:
            await self._refuse(scope, receive, send)
            return
        body = bytearray()
        try:
            await self._read(body, scope, receive, send)
        finally:
            BUDGET.give(len(body))

    async def _read(self, body: bytearray, scope: Scope, receive: Receive, send: Send) -> None:
        """Read the body whole into `body` (its bytes held in the process's budget), then run the app."""
        pending: deque[Message] = deque()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                pending.append(message)  # a disconnect: passed on for the app to see
                break
            part = message.get("body", b"")
            try:
                BUDGET.take(len(part), len(body))
            except RaglineError as busy:
                await envelope(busy.code, busy.message, busy.details, {"Retry-After": str(RETRY_AFTER_S)})(
                    scope, receive, send
                )
                return
            body.extend(part)
            if len(body) > self.max_body_size:
                await self._refuse(scope, receive, send)
                return
            if not message.get("more_body", False):
                pending.appendleft({"type": "http.request", "body": bytes(body), "more_body": False})
                break
        if scope["method"] == "POST" and (refused := rejection(bytes(body))) is not None:
            await jsonrpc_error(*refused)(scope, receive, send)
            return

        async def replay() -> Message:
            return pending.popleft() if pending else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_body_size
        response = envelope(ErrorCode.TOO_LARGE, f"the MCP message exceeds {limit} bytes", {"limit": limit})
        await response(scope, receive, send)


class _TenantFull(Exception):
    """Raised out of admission (under the SDK's lock) when the tenant holds its most sessions."""


class TenantSessions(PerRequestSessions):
    """`PerRequestSessions` with a cap of open sessions per tenant and the JSON body limit."""

    def __init__(self, app: MCPServer[Any, Any], *, per_tenant: int, retry_after_s: int, **sdk: Any) -> None:
        super().__init__(app, body_limit=EnvelopeBodyLimit, **sdk)
        self.per_tenant = per_tenant
        self.retry_after_s = retry_after_s
        self._streams: Counter[str] = Counter()  # open SSE sessions by tenant (services/mcp/http.py)

    def open_sessions(self, tenant: str) -> int:
        """The tenant's streamable-HTTP sessions and SSE streams in this process."""
        return self._streams[tenant] + sum(1 for who in self.session_owners() if who["client_id"] == tenant)

    @contextmanager
    def holding(self, tenant: str) -> Iterator[None]:
        """Count an SSE session of `tenant` while it is open."""
        self._streams[tenant] += 1
        try:
            yield
        finally:
            self._streams[tenant] -= 1
            if not self._streams[tenant]:
                del self._streams[tenant]

    def refusal(self) -> JSONResponse:
        limit = self.per_tenant
        return envelope(
            ErrorCode.RATE_LIMITED,
            f"this tenant holds {limit} open MCP sessions, its most: end one "
            "(DELETE /mcp with its mcp-session-id, or close its SSE stream) or let an unused one idle out",
            {"limit": limit, "retry_after": self.retry_after_s},
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def before_admission(self, requestor: AuthorizationContext | None) -> None:
        if requestor is not None and self.open_sessions(requestor["client_id"]) >= self.per_tenant:
            raise _TenantFull(requestor["client_id"])

    async def handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().handle_request(scope, receive, send)
        except _TenantFull:
            await self.refusal()(scope, receive, send)


def install_sessions(mcp: FastMCP[Any], settings: Settings) -> TenantSessions:
    """Give `mcp` a `TenantSessions` with the configured limits, built as FastMCP builds its own."""

    def make(**sdk: Any) -> TenantSessions:
        return TenantSessions(
            max_request_body_size=settings.mcp_request_limit,
            per_tenant=settings.mcp.sessions_per_tenant,
            retry_after_s=settings.api.retry_after_s,
            **sdk,
        )

    return install_session_manager(mcp, make)

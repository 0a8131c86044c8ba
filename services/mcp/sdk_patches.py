"""Every place Ragline reaches into the `mcp` SDK's private parts, and why: nowhere else does.

Written against the exact `mcp` version pinned in pyproject.toml and constraints.txt;
tests/unit/test_mcp_sdk_patches.py fails when the installed SDK is another version or when the
internals below change shape, so an upgrade re-checks each patch instead of breaking quietly.

1. `RaglineMCP.call_tool` replaces `FastMCP.call_tool` and calls `FastMCP._tool_manager`
   (`ToolManager.call_tool`, `get_tool`, `Tool.fn_metadata.convert_result`) itself: FastMCP's
   conversion rendered a result's text copy with an indent and a fallback serializer, and the
   low-level server checked it again against the output schema with a validator rebuilt on
   every call; our tools return the model their schema describes, sent as `results.model_result`
   writes it. Failures become `CODE: message` results (`results.error_result`).
   `RaglineMCP.list_tools` (a public override) gives clients the cheaper output schema
   (`output_schema.client_schema`). `RaglineMCP.get_prompt` asks `FastMCP._prompt_manager`
   whether the prompt exists, so an unknown one is answered with a JSON-RPC code.
2. `PerRequestTransport` overrides `StreamableHTTPServerTransport._handle_post_request` and turns
   `is_json_response_enabled` (a plain attribute its constructor sets) into a property, so each
   POST picks its answer mode (`answer_mode.wants_stream`) instead of the whole session.
3. `PerRequestSessions._admit_session` is the SDK's `StreamableHTTPSessionManager._admit_session`
   with the transport class swapped (it has no hook for the class); it writes the manager's
   `_server_instances` and `_session_owners`, and calls `before_admission` first (under the SDK's
   session-creation lock) so a subclass can refuse a session. `session_owners` reads
   `_session_owners`; the manager's `asgi_app` is rebuilt around `_handle_request` with the
   caller's body limit.
   `_handle_stateless_request` is the SDK's own too, with the same swap, for stateless mode.
4. `install_session_manager` builds that manager from FastMCP's `_mcp_server`, `_event_store`
   and `_retry_interval`, as `FastMCP.streamable_http_app` would, and sets `_session_manager`.
5. `limit_sse_posts` swaps `SseServerTransport._post_message_app` (the body limit in front of
   `_handle_post_message`) for the caller's; `low_level_server` is FastMCP's `_mcp_server`, which
   the SSE endpoint runs as the SDK's own `sse_app` does.
6. `FuncMetadata.pre_parse_json` is replaced (`SDK_PRE_PARSE_JSON` keeps the SDK's): FastMCP read
   every string argument of a field not typed exactly `str` as JSON, so an `ingest` whose
   `content` (`str | None`) was a JSON document arrived as an object and was refused, `null` as
   no content at all, and text nested 3,000 brackets deep raised RecursionError (INTERNAL). A
   field that takes text keeps what was sent; the others are read as JSON as before, for clients
   that send a list or an object as a string, where nesting too deep leaves the string as sent.
"""

from __future__ import annotations

import json
import logging
import typing
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar
from uuid import uuid4

import anyio
from anyio.abc import TaskStatus
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.exceptions import ResourceError, ToolError
from mcp.server.fastmcp.utilities.func_metadata import FuncMetadata
from mcp.server.lowlevel.helper_types import ReadResourceContents
from mcp.server.lowlevel.server import Server as MCPServer
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp.shared.exceptions import McpError
from mcp.types import INVALID_PARAMS, ErrorData, GetPromptResult
from mcp.types import Tool as MCPTool
from pydantic import AnyUrl, BaseModel
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from services.mcp.answer_mode import wants_stream
from services.mcp.output_schema import client_schema
from services.mcp.results import error_result, model_result

logger = logging.getLogger(__name__)
LifespanT = TypeVar("LifespanT")
SessionsT = TypeVar("SessionsT", bound=StreamableHTTPSessionManager)
BodyLimit = Callable[[ASGIApp, int], RequestBodyLimitMiddleware]
RESOURCE_NOT_FOUND = -32002  # the MCP spec's code for it (the SDK names none)

# The answer mode of one POST. Per request (each ASGI request is its own task, so its own
# context), not per session: two calls of one session can be in flight at once, and each must
# keep the mode it chose.
_json_answer: ContextVar[bool] = ContextVar("json_answer", default=False)


class RaglineMCP(FastMCP[LifespanT]):
    """FastMCP whose tool results go out as built and whose failures read `CODE: message` (patch 1)."""

    async def list_tools(self) -> list[MCPTool]:
        tools = await super().list_tools()
        for tool in tools:
            if tool.outputSchema is not None:
                tool.outputSchema = client_schema(tool.outputSchema)
        return tools

    async def read_resource(self, uri: AnyUrl | str) -> Iterable[ReadResourceContents]:
        """Ragline serves no resources: an unknown one is the spec's -32002, where FastMCP's error
        reached the client as code 0."""
        try:
            return await super().read_resource(uri)
        except (ResourceError, ValueError):  # the resource manager's "Unknown resource" is a ValueError
            error = ErrorData(code=RESOURCE_NOT_FOUND, message="resource not found", data={"uri": str(uri)})
            raise McpError(error) from None

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> GetPromptResult:
        """Ragline serves no prompts: an unknown one is invalid params (-32602), not code 0."""
        if self._prompt_manager.get_prompt(name) is None:
            raise McpError(ErrorData(code=INVALID_PARAMS, message=f"unknown prompt: {name[:100]}"))
        return await super().get_prompt(name, arguments)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        try:
            result = await self._tool_manager.call_tool(name, arguments, context=self.get_context())
        except ToolError as error:
            return error_result(error.__cause__ or error)
        if not isinstance(result, BaseModel):  # sent as FastMCP itself would send it
            tool = self._tool_manager.get_tool(name)
            return tool.fn_metadata.convert_result(result) if tool is not None else result
        return model_result(result)


def low_level_server(mcp: FastMCP[Any]) -> MCPServer[Any, Any]:
    """The low-level server under `mcp`, which a transport runs (patch 5)."""
    return mcp._mcp_server


class PerRequestTransport(StreamableHTTPServerTransport):
    """The SDK's transport, with `is_json_response_enabled` decided for each POST (patch 2)."""

    @property
    def is_json_response_enabled(self) -> bool:
        return _json_answer.get()

    @is_json_response_enabled.setter
    def is_json_response_enabled(self, _session_wide: bool) -> None:
        """The SDK's constructor fixes a mode for the whole session; each request picks its own."""

    async def _handle_post_request(
        self, scope: Scope, request: Request, receive: Receive, send: Send
    ) -> None:
        body = await request.body()  # Starlette keeps it: the SDK reads the same bytes again
        chosen = _json_answer.set(not wants_stream(body, request.headers.get("accept", "")))
        try:
            await super()._handle_post_request(scope, request, receive, send)
        finally:
            _json_answer.reset(chosen)


class PerRequestSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, opening each session on a `PerRequestTransport` (patch 3)."""

    def __init__(self, app: MCPServer[Any, Any], *, body_limit: BodyLimit, **sdk: Any) -> None:
        super().__init__(app, **sdk)
        self.asgi_app = body_limit(self._handle_request, self.max_request_body_size)

    def before_admission(self, requestor: AuthorizationContext | None) -> None:
        """Called before a new session opens, under the SDK's lock; raise to refuse it."""

    def session_owners(self) -> list[AuthorizationContext]:
        """Who opened each open session (sessions opened without an identity are not listed)."""
        return list(self._session_owners.values())

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        self.before_admission(requestor)
        # The SDK's own body, with the transport class swapped.
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        transport = PerRequestTransport(
            mcp_session_id=uuid4().hex,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
        )
        session_id = transport.mcp_session_id
        assert session_id is not None
        if requestor is not None:
            self._session_owners[session_id] = requestor
        self._server_instances[session_id] = transport
        return transport

    async def _handle_stateless_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The SDK's own body, with the transport class swapped.
        transport = PerRequestTransport(
            mcp_session_id=None, event_store=None, security_settings=self.security_settings
        )

        async def run_stateless_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with transport.connect() as (read_stream, write_stream):
                task_status.started()
                try:
                    await self.app.run(
                        read_stream, write_stream, self.app.create_initialization_options(), stateless=True
                    )
                except Exception:
                    logger.exception("stateless MCP request crashed")

        assert self._task_group is not None
        try:
            await self._task_group.start(run_stateless_server)
            await transport.handle_request(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await transport.terminate()


def install_session_manager(mcp: FastMCP[Any], make: Callable[..., SessionsT]) -> SessionsT:
    """Give `mcp` the session manager `make` builds, from what FastMCP builds its own (patch 4)."""
    settings = mcp.settings
    sessions = make(
        app=mcp._mcp_server,
        stateless=settings.stateless_http,
        event_store=mcp._event_store,
        retry_interval=mcp._retry_interval,
        security_settings=settings.transport_security,
        session_idle_timeout=settings.session_idle_timeout,
        max_sessions=settings.max_sessions,
    )
    mcp._session_manager = sessions
    return sessions


def limit_sse_posts(sse: SseServerTransport, body_limit: BodyLimit, limit: int) -> None:
    """Put `body_limit` in front of the SSE transport's post handler instead of the SDK's (patch 5)."""
    sse._post_message_app = body_limit(sse._handle_post_message, limit)


SDK_PRE_PARSE_JSON = FuncMetadata.pre_parse_json


def _takes_text(annotation: Any) -> bool:
    return annotation is str or str in typing.get_args(annotation)


def _pre_parse_json(self: FuncMetadata, data: dict[str, Any]) -> dict[str, Any]:
    """Patch 6: a string argument read as JSON only where its field takes no text."""
    fields = {}
    for name, info in self.arg_model.model_fields.items():
        fields[name] = info
        if info.alias:
            fields[info.alias] = info
    parsed = dict(data)
    for key, value in data.items():
        field = fields.get(key)
        if field is None or not isinstance(value, str) or _takes_text(field.annotation):
            continue
        try:
            loaded = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if isinstance(loaded, dict | list):
            parsed[key] = loaded
    return parsed


FuncMetadata.pre_parse_json = _pre_parse_json  # type: ignore[method-assign]

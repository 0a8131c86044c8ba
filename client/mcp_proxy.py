"""`ragline mcp --server URL`: a stdio MCP server that serves a remote Ragline's tools.

A desktop client starts it like the local stdio server; it lists the remote's tools with their
schemas, forwards each call over one streamable-HTTP session (reopened when the remote drops it)
and relays `ingest`'s progress notifications. Its one addition is `path` on `ingest`: a file on
this machine, read here and sent as `content_base64`, which a remote server cannot reach itself.
"""

from __future__ import annotations

import base64
import copy
import logging
import os
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamablehttp_client
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import McpError

log = logging.getLogger(__name__)

PATH_FIELD = {
    "type": "string",
    "description": "A file on the machine this proxy runs on: read and uploaded (instead of content).",
}
# The largest local file the proxy reads: base64 in one JSON-RPC message, so it stays in memory
# three times over; the server refuses what exceeds its own limit with TOO_LARGE.
MAX_PATH_BYTES = 100 * 2**20
SESSION_GONE = 32600  # the SDK client's code when the server no longer knows the session
CONNECT_WAIT_S = 15.0  # how long a call waits for the remote before it answers UNAVAILABLE
RETRY_AFTER_S = (0.5, 1.0, 2.0, 5.0)


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)


class RemoteRagline:
    """One streamable-HTTP MCP session with the remote, kept open by a task of its own.

    The SDK's client streams live in the task that opened them, so the session is opened and
    closed by `keep`, and calls from any handler task use it through `session()`.
    """

    def __init__(self, url: str, api_key: str | None) -> None:
        self.url = url.rstrip("/") + "/mcp"
        self.headers = {"X-Api-Key": api_key} if api_key else {}
        self._session: ClientSession | None = None
        self._tried = anyio.Event()  # set once the first attempt to open a session has ended
        self._broken = anyio.Event()
        self.failure = f"UNAVAILABLE: cannot reach the Ragline server at {self.url}"

    async def keep(self) -> None:
        attempt = 0
        while True:
            try:
                async with (
                    streamablehttp_client(self.url, headers=self.headers) as (read, write, _),
                    ClientSession(read, write) as session,
                ):
                    await session.initialize()
                    self._session, attempt, self.failure = session, 0, ""
                    self._tried.set()
                    await self._broken.wait()
            except Exception as error:  # noqa: BLE001  (any failure to reach the remote: retried)
                self.failure = _failure(self.url, error)
                log.warning("%s", self.failure)
                self._tried.set()  # callers waiting for a session learn that there is none
            self._session = None
            self._broken = anyio.Event()
            await anyio.sleep(RETRY_AFTER_S[min(attempt, len(RETRY_AFTER_S) - 1)])
            attempt += 1

    async def session(self) -> ClientSession | None:
        """The open session; None (see `failure`) when the last attempt to open one failed."""
        with anyio.move_on_after(CONNECT_WAIT_S):
            await self._tried.wait()
        return self._session

    def drop(self, session: ClientSession) -> None:
        """The session failed under a call: the keeper opens a new one, which callers wait for."""
        if self._session is session:
            self._session = None
            self._tried = anyio.Event()
            self._broken.set()


def _causes(error: BaseException) -> list[BaseException]:
    """The error, the errors of its groups and its causes, depth first."""
    found = [error]
    for inner in getattr(error, "exceptions", ()):
        found += _causes(inner)
    if error.__cause__ is not None:
        found += _causes(error.__cause__)
    return found


def _failure(url: str, error: BaseException) -> str:
    """What a failed attempt to open the session means, as `CODE: message`."""
    for cause in _causes(error):
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code in (401, 403):
            return f"AUTH_ERROR: the Ragline server at {url} refused the key (RAGLINE_API_KEY)"
    return f"UNAVAILABLE: cannot reach the Ragline server at {url} ({type(error).__name__})"


def _with_path(tool: types.Tool) -> types.Tool:
    if tool.name != "ingest":
        return tool
    schema = copy.deepcopy(tool.inputSchema)
    schema.setdefault("properties", {})["path"] = PATH_FIELD
    return tool.model_copy(update={"inputSchema": schema})


def read_local_file(arguments: dict[str, Any]) -> dict[str, Any]:
    """`ingest` arguments with `path` replaced by the file's bytes and, unless given, its name."""
    out = dict(arguments)
    path = Path(os.path.expanduser(str(out.pop("path"))))
    if any(out.get(other) is not None for other in ("content", "content_base64", "url")):
        raise ValueError("give one of path, content, content_base64 and url, not several")
    if not path.is_file():  # a directory, a FIFO or a device would block or never end
        raise ValueError(f"{path} is not a regular file")
    with path.open("rb") as file:
        data = file.read(MAX_PATH_BYTES + 1)
    if len(data) > MAX_PATH_BYTES:
        raise ValueError(f"{path} is larger than {MAX_PATH_BYTES // 2**20} MiB")
    out["content_base64"] = base64.b64encode(data).decode()
    out.setdefault("filename", path.name)
    return out


def build_proxy(remote: RemoteRagline) -> Server[Any, Any]:
    server: Server[Any, Any] = Server("ragline", instructions="Ragline, served from a remote server.")

    async def remote_call(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        ctx = server.request_context
        token = ctx.meta.progressToken if ctx.meta else None

        async def relay(progress: float, total: float | None, message: str | None) -> None:
            if token is not None:
                await ctx.session.send_progress_notification(
                    token, progress, total, message, related_request_id=str(ctx.request_id)
                )

        for _ in range(2):  # once more on a fresh session when the remote dropped this one
            session = await remote.session()
            if session is None:
                return _error(remote.failure)
            try:
                return await session.call_tool(name, arguments, progress_callback=relay)
            except McpError as error:
                if error.error.code != SESSION_GONE:  # the remote answered: a protocol error
                    return _error(f"INVALID_ARGUMENT: {error.error.message}")
                remote.drop(session)
            except Exception as error:  # noqa: BLE001  (the transport failed, not the tool)
                log.warning("call of %s failed on the remote session: %s", name, error)
                remote.drop(session)
        return _error(f"UNAVAILABLE: the Ragline server at {remote.url} dropped the call")

    @server.list_tools()  # type: ignore[no-untyped-call, untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        session = await remote.session()
        if session is None:
            raise RuntimeError(remote.failure)
        listed = await session.list_tools()
        return [_with_path(tool) for tool in listed.tools]

    # The remote validates arguments and results with the same schemas; checking them here too
    # would only add a second copy of each message.
    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if name == "ingest" and arguments.get("path") is not None:
            try:
                arguments = await anyio.to_thread.run_sync(read_local_file, arguments)
            except (OSError, ValueError) as error:
                return _error(f"INVALID_ARGUMENT: path: {error}")
        return await remote_call(name, arguments)

    return server


async def _serve(url: str, api_key: str | None) -> None:
    remote = RemoteRagline(url, api_key)
    server = build_proxy(remote)
    options = server.create_initialization_options(NotificationOptions(), {})
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(remote.keep)
        async with stdio_server() as (read, write):
            await server.run(read, write, options)
        tasks.cancel_scope.cancel()


def serve_proxy(url: str, api_key: str | None) -> None:
    """Run the proxy on stdin/stdout until the client closes it."""
    anyio.run(_serve, url, api_key)

"""An SSE session ends after `RAGLINE_MCP__SESSION_IDLE_S` with no request in flight.

A streamable-HTTP session idles out in the SDK; an SSE session lives as long as its stream, and a
client that opens one and goes quiet (or a proxy that keeps the connection up) held its place
against the tenant's session cap for ever. As in the SDK's streamable-HTTP sessions, the clock
runs only while no request is in flight, and every message moves it, so neither a conversation
that goes on nor a long tool call ends here.
"""

from __future__ import annotations

import math
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.lowlevel.server import Server as MCPServer
from mcp.shared.message import SessionMessage
from mcp.types import JSONRPCError, JSONRPCRequest, JSONRPCResponse


async def run_until_idle(
    server: MCPServer[Any, Any],
    read: MemoryObjectReceiveStream[SessionMessage | Exception],
    write: MemoryObjectSendStream[SessionMessage],
    idle_s: float,
) -> None:
    """Run the low-level server on the SSE session's streams until it ends or idles out; either
    way both streams are closed, and closing the one to the client ends its SSE response."""
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound, outbound_read = anyio.create_memory_object_stream[SessionMessage](0)
    in_flight: set[str | int] = set()
    async with read, write:
        with anyio.CancelScope() as idle:

            def touch() -> None:
                idle.deadline = math.inf if in_flight else anyio.current_time() + idle_s

            async def take_in() -> None:
                async with inbound_send:
                    async for message in read:
                        if isinstance(message, SessionMessage) and isinstance(
                            message.message.root, JSONRPCRequest
                        ):
                            in_flight.add(message.message.root.id)
                        touch()
                        await inbound_send.send(message)

            async def send_out() -> None:
                async with outbound_read:
                    async for message in outbound_read:
                        if isinstance(message.message.root, JSONRPCResponse | JSONRPCError):
                            in_flight.discard(message.message.root.id)
                        touch()
                        try:
                            await write.send(message)
                        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                            idle.cancel()  # the client went: nothing more can reach it
                            return

            touch()
            async with anyio.create_task_group() as pumps:
                pumps.start_soon(take_in)
                pumps.start_soon(send_out)
                await server.run(inbound, outbound, server.create_initialization_options())
                pumps.cancel_scope.cancel()

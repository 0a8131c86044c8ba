"""An SSE session ends after `RAGLINE_MCP__SESSION_IDLE_S` with no message either way.

A streamable-HTTP session idles out in the SDK; an SSE session lives as long as its stream, and a
client that opens one and goes quiet (or a proxy that keeps the connection up) held its place
against the tenant's session cap for ever. Every message in or out moves the deadline, so a
conversation that goes on never ends here.
"""

from __future__ import annotations

from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.server.lowlevel.server import Server as MCPServer
from mcp.shared.message import SessionMessage


async def run_until_idle(
    server: MCPServer[Any, Any],
    read: MemoryObjectReceiveStream[SessionMessage | Exception],
    write: MemoryObjectSendStream[SessionMessage],
    idle_s: float,
) -> None:
    """Run the low-level server on the SSE session's streams until it ends or idles out; either
    way the stream to the client is closed, which ends its SSE response."""
    inbound_send, inbound = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    outbound, outbound_read = anyio.create_memory_object_stream[SessionMessage](0)
    with anyio.CancelScope() as idle:

        def touch() -> None:
            idle.deadline = anyio.current_time() + idle_s

        async def take_in() -> None:
            async with inbound_send:
                async for message in read:
                    touch()
                    await inbound_send.send(message)

        async def send_out() -> None:
            async with outbound_read:
                async for message in outbound_read:
                    touch()
                    await write.send(message)

        touch()
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(take_in)
            pumps.start_soon(send_out)
            await server.run(inbound, outbound, server.create_initialization_options())
            pumps.cancel_scope.cancel()
    await write.aclose()

"""What a tool call answers: a finished model as compact JSON, or a failure as `CODE: message`.

Domain failures come back as tool results with `isError: true` and the REST codes; protocol
errors stay protocol errors; no stack trace reaches a client.
"""

from __future__ import annotations

import logging

import pydantic_core
from mcp.server.fastmcp.exceptions import ToolError
from mcp.types import CallToolResult, ContentBlock, TextContent
from pydantic import BaseModel, ValidationError

from services.mcp.outage import outage_message, unreachable
from services.mcp.output_schema import structured
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)


def model_result(result: BaseModel) -> CallToolResult:
    """A tool's model as it goes out: structured content, and a compact JSON text copy.

    The model was validated as it was built, so it is not checked again against its schema;
    the text copy (for clients that read only text) is compact JSON, which the client and the
    model read whole.
    """
    body = structured(result)
    content: list[ContentBlock] = [TextContent(type="text", text=pydantic_core.to_json(body).decode())]
    return CallToolResult(content=content, structuredContent=body, isError=False)


def error_result(cause: BaseException) -> CallToolResult:
    """A failed call as `CODE: message` with `isError: true`; an unexpected failure is logged."""
    if isinstance(cause, RaglineError):
        text = f"{cause.code.value}: {cause.message}"
    elif isinstance(cause, ValidationError):
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in cause.errors()[:5]
        )
        text = f"{ErrorCode.INVALID_ARGUMENT.value}: {problems}"
    elif isinstance(cause, ToolError):
        text = f"{ErrorCode.INVALID_ARGUMENT.value}: {cause}"
    elif (down := unreachable(cause)) is not None:
        text = f"{ErrorCode.UNAVAILABLE.value}: {outage_message(down)}"
    else:
        log.error("tool failed: %s", type(cause).__name__, exc_info=cause)
        text = f"{ErrorCode.INTERNAL.value}: internal error"
    content: list[ContentBlock] = [TextContent(type="text", text=text)]
    return CallToolResult(content=content, isError=True)

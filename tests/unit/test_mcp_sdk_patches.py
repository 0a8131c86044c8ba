"""The `mcp` SDK is the version `services/mcp/sdk_patches.py` was written against, in the shape
its patches rely on: an upgrade fails here, by name, before it fails in a session."""

from __future__ import annotations

import hashlib
import importlib.metadata
import inspect
import re
import textwrap
import tomllib
from pathlib import Path
from typing import Any

from mcp.server.fastmcp import FastMCP
from mcp.server.fastmcp.prompts.manager import PromptManager
from mcp.server.fastmcp.tools.base import Tool
from mcp.server.fastmcp.tools.tool_manager import ToolManager
from mcp.server.fastmcp.utilities.func_metadata import FuncMetadata
from mcp.server.sse import SseServerTransport
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from services.mcp import sdk_patches

REPO = Path(__file__).resolve().parents[2]

# What the copied or replaced SDK methods read, as written in the pinned version: a change
# there means the copy in sdk_patches.py must be compared with the new body again.
SOURCE_SHA256 = {
    "StreamableHTTPSessionManager._admit_session": (
        "326a80bc8ba22650c1c4c3eb08ec3a306edc28346a0490e71ffc7838e550a0ee"
    ),
    "StreamableHTTPSessionManager._handle_stateless_request": (
        "8fcfd8af6de2aa24b90fa3121b9fac541a124333afe46d08b124d3115228a2dd"
    ),
    "FastMCP.call_tool": "4c4cebbae840c98423b6589b4870742d88855426364dfc489ca4112aaf1d9818",
    "FuncMetadata.pre_parse_json": "9738ca99e7f492cbd3082df3e591ddb72c8f6c4d94ac930e405512be1e07ae56",
}


def _pins() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (in_pyproject,) = [d for d in project["dependencies"] if re.match(r"mcp\b", d)]
    (in_constraints,) = re.findall(r"^mcp==(\S+)$", (REPO / "constraints.txt").read_text(), re.M)
    return {"pyproject.toml": in_pyproject, "constraints.txt": f"mcp=={in_constraints}"}


def _digest(method: Any) -> str:
    return hashlib.sha256(textwrap.dedent(inspect.getsource(method)).encode()).hexdigest()


def _parameters(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_the_installed_sdk_is_the_pinned_version() -> None:
    pins = _pins()
    assert set(pins.values()) == {pins["pyproject.toml"]}, pins  # the two pins agree, exactly
    assert pins["pyproject.toml"] == f"mcp=={importlib.metadata.version('mcp')}"


def test_the_copied_and_replaced_sdk_methods_are_unchanged() -> None:
    actual = {
        "StreamableHTTPSessionManager._admit_session": _digest(StreamableHTTPSessionManager._admit_session),
        "StreamableHTTPSessionManager._handle_stateless_request": _digest(
            StreamableHTTPSessionManager._handle_stateless_request
        ),
        "FastMCP.call_tool": _digest(FastMCP.call_tool),
        "FuncMetadata.pre_parse_json": _digest(sdk_patches.SDK_PRE_PARSE_JSON),
    }
    assert actual == SOURCE_SHA256


def test_fastmcp_has_the_private_parts_the_server_patches() -> None:
    mcp: FastMCP[Any] = FastMCP(name="shape")
    for attribute in ("_tool_manager", "_mcp_server", "_event_store", "_retry_interval", "_session_manager"):
        assert hasattr(mcp, attribute), attribute
    assert isinstance(mcp._tool_manager, ToolManager)
    assert _parameters(ToolManager.call_tool)[:4] == ["self", "name", "arguments", "context"]
    assert _parameters(ToolManager.get_tool) == ["self", "name"]
    assert "fn_metadata" in Tool.model_fields
    assert _parameters(FuncMetadata.convert_result) == ["self", "result"]
    assert _parameters(FastMCP.call_tool) == ["self", "name", "arguments"]
    assert isinstance(mcp._prompt_manager, PromptManager)
    assert _parameters(PromptManager.get_prompt) == ["self", "name"]
    assert _parameters(FastMCP.get_prompt) == ["self", "name", "arguments"]
    assert _parameters(FastMCP.read_resource) == ["self", "uri"]
    assert {"stateless_http", "transport_security", "session_idle_timeout", "max_sessions"} <= set(
        type(mcp.settings).model_fields
    )


def test_the_session_manager_has_the_parts_the_per_request_sessions_use() -> None:
    manager = StreamableHTTPSessionManager(app=FastMCP(name="shape")._mcp_server)
    for attribute in ("_server_instances", "_session_owners", "_session_creation_lock", "asgi_app"):
        assert hasattr(manager, attribute), attribute
    for attribute in ("max_sessions", "event_store", "security_settings", "retry_interval"):
        assert hasattr(manager, attribute), attribute
    assert {"session_idle_timeout", "max_request_body_size"} <= set(vars(manager))
    assert callable(manager._handle_request)
    assert _parameters(StreamableHTTPSessionManager._admit_session) == ["self", "requestor"]
    assert _parameters(StreamableHTTPSessionManager._handle_stateless_request) == [
        "self",
        "scope",
        "receive",
        "send",
    ]
    assert "await self._handle_stateless_request(scope, receive, send)" in inspect.getsource(
        StreamableHTTPSessionManager._handle_request
    )
    assert {"stateless", "_task_group", "app"} <= set(vars(manager))
    assert "self._admit_session(requestor)" in inspect.getsource(StreamableHTTPSessionManager)
    assert {
        "event_store",
        "retry_interval",
        "security_settings",
        "session_idle_timeout",
        "max_sessions",
    } <= set(_parameters(StreamableHTTPSessionManager.__init__))


def test_the_transport_reads_its_answer_mode_where_the_patch_sets_it() -> None:
    assert _parameters(StreamableHTTPServerTransport._handle_post_request) == [
        "self",
        "scope",
        "request",
        "receive",
        "send",
    ]
    source = inspect.getsource(StreamableHTTPServerTransport)
    assert "self.is_json_response_enabled = is_json_response_enabled" in source  # the setter we swallow
    assert "if self.is_json_response_enabled" in inspect.getsource(
        StreamableHTTPServerTransport._handle_post_request
    )
    assert {"mcp_session_id", "event_store", "security_settings", "retry_interval", "idle_timeout"} <= set(
        _parameters(StreamableHTTPServerTransport.__init__)
    )
    # The property replaces a plain attribute: the SDK must not have made it a property itself.
    assert "is_json_response_enabled" not in vars(StreamableHTTPServerTransport)
    assert isinstance(vars(sdk_patches.PerRequestTransport)["is_json_response_enabled"], property)


def test_the_sse_transport_posts_through_the_app_the_patch_swaps() -> None:
    sse = SseServerTransport("/messages/")
    assert hasattr(sse, "_post_message_app")
    assert callable(sse._handle_post_message)
    assert "self._post_message_app(scope, receive, send)" in inspect.getsource(
        SseServerTransport.handle_post_message
    )


def test_text_arguments_keep_what_was_sent_and_the_rest_are_read_as_json() -> None:
    mcp: FastMCP[Any] = FastMCP(name="pre-parse")

    def tool(content: str | None = None, name: str = "", tags: list[str] | None = None) -> str:
        return ""

    mcp.add_tool(tool)
    metadata = mcp._tool_manager.get_tool("tool").fn_metadata  # type: ignore[union-attr]
    deep = "[" * 3000 + "]" * 3000
    assert FuncMetadata.pre_parse_json is not sdk_patches.SDK_PRE_PARSE_JSON
    assert metadata.pre_parse_json({"content": '{"port": 8080}', "name": "[1]", "tags": '["a", "b"]'}) == {
        "content": '{"port": 8080}',
        "name": "[1]",
        "tags": ["a", "b"],
    }
    assert metadata.pre_parse_json({"content": "null", "tags": deep}) == {"content": "null", "tags": deep}

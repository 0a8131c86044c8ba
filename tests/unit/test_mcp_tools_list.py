"""The MCP `tools/list` answer stays byte-identical: names, descriptions, schemas, annotations.

`mcp_tools_list.json` was written from the tools as they were before they became module-level
functions; any change to a tool's surface shows up here as a diff against it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from services.mcp.server import build_mcp
from shared.config import Settings

EXPECTED = Path(__file__).with_name("mcp_tools_list.json")


def _tools_list() -> list[dict[str, Any]]:
    mcp = build_mcp(cast(Any, SimpleNamespace(settings=Settings())))
    tools = asyncio.run(mcp.list_tools())
    return [tool.model_dump(mode="json", by_alias=True, exclude_none=True) for tool in tools]


def test_tools_list_matches_the_snapshot() -> None:
    expected = json.loads(EXPECTED.read_text())
    actual = _tools_list()
    assert [tool["name"] for tool in actual] == [tool["name"] for tool in expected]
    for got, want in zip(actual, expected, strict=True):
        assert got == want, got["name"]


def test_the_snapshot_is_the_wire_text() -> None:
    # Key order inside a schema is part of what a client receives; compare the JSON text too.
    expected = json.loads(EXPECTED.read_text())
    assert json.dumps(_tools_list()) == json.dumps(expected)

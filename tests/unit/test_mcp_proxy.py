"""The stdio proxy's own logic: `path` on ingest, and what a failed connection means."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import pytest
from mcp import types

from client import mcp_proxy
from client.mcp_proxy import PATH_FIELD, _failure, _with_path, read_local_file


def test_a_path_becomes_the_files_bytes_and_its_name(tmp_path: Path) -> None:
    file = tmp_path / "report.pdf"
    file.write_bytes(b"%PDF-1.4 \x00\xff")
    sent = read_local_file({"kb_id": "kb", "path": str(file)})
    assert sent == {
        "kb_id": "kb",
        "content_base64": base64.b64encode(b"%PDF-1.4 \x00\xff").decode(),
        "filename": "report.pdf",
    }


def test_a_given_filename_wins_over_the_paths(tmp_path: Path) -> None:
    file = tmp_path / "a.txt"
    file.write_text("x")
    assert read_local_file({"path": str(file), "filename": "b.md"})["filename"] == "b.md"


def test_a_path_with_content_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "a.txt"
    file.write_text("x")
    with pytest.raises(ValueError, match="not several"):
        read_local_file({"path": str(file), "content": "y"})


def test_only_ingest_gains_the_path_field() -> None:
    schema = {"type": "object", "properties": {"kb_id": {"type": "string"}}}
    ingest = types.Tool(name="ingest", inputSchema=schema)
    search = types.Tool(name="search", inputSchema=schema)
    assert _with_path(ingest).inputSchema["properties"]["path"] == PATH_FIELD
    assert "path" not in _with_path(search).inputSchema["properties"]
    assert "path" not in schema["properties"], "the remote's schema was changed in place"


def test_a_refused_key_inside_a_task_group_reads_as_an_auth_error() -> None:
    request = httpx.Request("POST", "http://remote/mcp")
    refused = httpx.HTTPStatusError("401", request=request, response=httpx.Response(401, request=request))
    group = ExceptionGroup("tasks", [RuntimeError("closed"), ExceptionGroup("inner", [refused])])
    assert _failure("http://remote/mcp", group).startswith("AUTH_ERROR: ")
    assert _failure("http://remote/mcp", httpx.ConnectError("refused")).startswith("UNAVAILABLE: ")


def test_a_path_that_is_not_a_regular_file_is_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)  # reading it would block the proxy until a writer came
    for path in (tmp_path, fifo, Path("/dev/zero"), tmp_path / "absent"):
        with pytest.raises(ValueError, match="not a regular file"):
            read_local_file({"path": str(path)})


def test_a_file_over_the_bound_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_proxy, "MAX_PATH_BYTES", 10)
    file = tmp_path / "big.txt"
    file.write_bytes(b"x" * 11)
    with pytest.raises(ValueError, match="larger than"):
        read_local_file({"path": str(file)})
    file.write_bytes(b"x" * 10)
    assert read_local_file({"path": str(file)})["content_base64"] == base64.b64encode(b"x" * 10).decode()

"""Which MCP requests are answered on an event stream: those that may carry a progress token."""

from __future__ import annotations

import json

from services.mcp.answer_mode import wants_stream

BOTH = "application/json, text/event-stream"


def body(params: dict[str, object]) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}).encode()


def test_a_progress_token_asks_for_a_stream() -> None:
    assert wants_stream(body({"name": "ingest", "arguments": {}, "_meta": {"progressToken": 7}}), BOTH)
    assert wants_stream(b'{"params":{"_meta":{"progressToken":"a"}}}', BOTH)  # compact, as most send


def test_a_client_that_takes_only_json_gets_json_even_when_it_asks_for_progress() -> None:
    assert not wants_stream(body({"name": "ingest", "_meta": {"progressToken": 7}}), "application/json")


def test_a_call_without_one_is_answered_as_json() -> None:
    assert not wants_stream(body({"name": "search", "arguments": {"query": "progress token"}}), BOTH)
    assert not wants_stream(body({"name": "search", "arguments": {"query": "x"}, "_meta": {}}), BOTH)


def test_the_words_inside_a_document_do_not_ask_for_a_stream() -> None:
    text = 'the request carries "progressToken": 5 in its _meta'
    assert not wants_stream(body({"name": "ingest", "arguments": {"content": text}}), BOTH)

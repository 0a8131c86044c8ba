"""Probes and malformed requests get the status they name: HEAD probes pass, a wrong method is a
405 with its Allow header, and /mcp answers a body its parser cannot take as a JSON-RPC parse error."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import MCP_INITIALIZE, Server

pytestmark = pytest.mark.e2e

MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def test_head_probes_answer_like_get(server: Server) -> None:
    with server.client(None) as client:
        for path in ("/healthz", "/readyz"):
            head, get = client.head(path), client.get(path)
            assert head.status_code == get.status_code, (path, head.status_code, get.text)
            assert head.status_code in (200, 503)
            assert head.content == b""
        assert client.head("/healthz").status_code == 200


def test_a_method_the_path_does_not_take_is_a_405_with_allow(server: Server) -> None:
    with server.client("a_admin") as client:
        for method, path in [("PUT", "/healthz"), ("DELETE", "/readyz"), ("PUT", "/v1/search")]:
            response = client.request(method, path)
            assert response.status_code == 405, (method, path, response.text)
            assert response.json()["code"] == "INVALID_ARGUMENT"
            assert method not in response.headers["allow"]
            assert "GET" in response.headers["allow"] or "POST" in response.headers["allow"]


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"\xff\xfe"}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + b'{"a":' * 50_000 + b"1" + b"}" * 50_001,
        # Python reads no integer of over 4,300 digits: the SDK answered 500 and logged a traceback.
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"search","arguments":'
        b'{"query":"x","top_k":' + b"7" * 5000 + b"}}}",
        # Broken JSON: the SDK's own answer carried the id "server-error", where JSON-RPC says null.
        b'{"jsonrpc":"2.0","id":1,"method":',
        # A lone surrogate: the SDK answered 500 and logged a traceback.
        b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}',
        # NaN is no JSON: over MCP, update_source took one and changed nothing, answering success.
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"update_source","arguments":'
        b'{"kb_id":"k","source_id":"s","change":{"max_deleted_share":NaN}}}}',
    ],
    ids=[
        "invalid-utf8",
        "nested-lists",
        "nested-objects",
        "long-integer",
        "broken-json",
        "lone-surrogate",
        "nan",
    ],
)
def test_mcp_answers_an_unparseable_body_with_a_parse_error(server: Server, body: bytes) -> None:
    log_before = server.log.stat().st_size
    with server.client("a_admin") as client:
        response = client.post("/mcp", content=body, headers=MCP_HEADERS)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == -32700
        assert response.json()["id"] is None
        assert client.get("/healthz").status_code == 200
    with server.log.open("rb") as log:
        log.seek(log_before)
        assert b"Traceback" not in log.read()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', "the id must be a string or an integer"),
        (b'{"jsonrpc":"2.0","id":{"n":1},"method":"ping"}', "the id must be a string or an integer"),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', "the id must be a string or an integer"),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', "the id must be a string or an integer"),
        (
            b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]',
            "batches are not supported; send one message a request",
        ),
        # The SDK answered these with pydantic's whole error text, the values sent quoted, and the
        # id "server-error".
        (b'"ping"', "a message is a JSON object"),
        (b"42", "a message is a JSON object"),
        (
            b'{"jsonrpc":"1.0","id":1,"method":"ping","params":{"token":"hunter2"}}',
            'a message has "jsonrpc": "2.0"',
        ),
        (
            b'{"jsonrpc":"2.0","id":1,"error":{"code":"hunter2","message":"m"}}',
            "an error's code must be an integer",
        ),
        (b'{"jsonrpc":"2.0","id":1,"result":["hunter2"]}', "a result must be an object"),
    ],
    ids=[
        "null-id",
        "object-id",
        "fraction-id",
        "boolean-id",
        "batch",
        "string",
        "number",
        "jsonrpc-1",
        "error-code-text",
        "result-array",
    ],
)
def test_mcp_answers_a_request_it_cannot_answer_with_invalid_request(
    server: Server, body: bytes, reason: str
) -> None:
    # The SDK took the first four for notifications (202: the client waited for an answer that
    # never came) and answered the batch with a validation error that quoted the input back.
    with server.client("a_admin") as client:
        opened = client.post("/mcp", headers=MCP_HEADERS, json=MCP_INITIALIZE)
        session = {"mcp-session-id": opened.headers["mcp-session-id"], **MCP_HEADERS}
        response = client.post("/mcp", content=body, headers=session)
        assert response.status_code == 400, response.text
        assert response.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32600, "message": f"Invalid Request: {reason}"},
        }
        fine = client.post("/mcp", content=b'{"jsonrpc":"2.0","id":"a","method":"ping"}', headers=session)
        assert fine.json() == {"jsonrpc": "2.0", "id": "a", "result": {}}


def test_every_openapi_operation_has_its_own_id(server: Server) -> None:
    with server.client("a_admin") as client:
        schema = client.get("/openapi.json").json()
    operations = [op for item in schema["paths"].values() for op in item.values()]
    ids = [op["operationId"] for op in operations if "operationId" in op]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    assert set(schema["paths"]["/healthz"]) == {"get"}

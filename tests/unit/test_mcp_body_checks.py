"""What the MCP body check refuses before the SDK's parser, which would crash on it or answer it
badly, and what it lets by."""

from __future__ import annotations

import pytest
from mcp.types import INVALID_REQUEST, PARSE_ERROR

from services.mcp.sessions import MAX_NUMBER_DIGITS, REQUEST_CHECK_BYTES, rejection, unparseable


def test_a_number_python_will_not_read_is_refused_but_digits_in_a_string_are_text() -> None:
    digits = "9" * (MAX_NUMBER_DIGITS + 1)
    refused = unparseable(f'{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"n":{digits}}}}}'.encode())
    assert refused == f"a number of more than {MAX_NUMBER_DIGITS} digits"
    assert (
        unparseable(f'{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"n":"{digits}"}}}}'.encode()) is None
    )
    assert unparseable(f'{{"n":{"9" * MAX_NUMBER_DIGITS}}}'.encode()) is None


@pytest.mark.timeout(20)
def test_many_runs_just_under_the_bound_are_checked_in_one_pass() -> None:
    """Tried from every digit, 600 runs of 4,300 digits held the API's event loop 24 s; 2,000
    would take minutes. Each run is now tried once, where it starts."""
    body = ('{"a":[' + ",".join(["7" * MAX_NUMBER_DIGITS] * 2000) + "]}").encode()
    assert unparseable(body) is None


def _padded(template: bytes) -> bytes:
    """`template` with its %s filled past the size whose whole the check reads again."""
    return template.replace(b"%s", b"x" * REQUEST_CHECK_BYTES)


def _ingest(content: bytes) -> bytes:
    """An ingest call whose content (a JSON string) is padded past that size."""
    pad = b" " * REQUEST_CHECK_BYTES
    return (
        b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"ingest","arguments":'
        b'{"kb_id":"k","doc_id":"d","content":' + content + pad + b"}}}"
    )


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"jsonrpc":"2.0","id":1,', PARSE_ERROR),
        (b"ping", PARSE_ERROR),
        (b'"x"', INVALID_REQUEST),
        (b"5", INVALID_REQUEST),
        (b"null", INVALID_REQUEST),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"' + b"\xff" + b'"}', PARSE_ERROR),
        # No JSON numbers: a NaN passed the numeric bounds of a tool's arguments.
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":{"share":NaN}}}', PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"a":[-Infinity]}}', PARSE_ERROR),
        # A lone surrogate parses as JSON but is no Unicode: the SDK answered 500 on it.
        (b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}', PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"x\\udc00":1}}', PARSE_ERROR),
        # No JSON-RPC 2.0 message: the SDK quoted the values sent (a secret, perhaps) back.
        (b'{"jsonrpc":"1.0","id":1,"method":"ping","params":{"secret":"s"}}', INVALID_REQUEST),
        (b'{"id":1,"method":"ping"}', INVALID_REQUEST),
        (b"{}", INVALID_REQUEST),
        (b'{"jsonrpc":"2.0"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":5}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":["a"]}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":"x"}', INVALID_REQUEST),
        # A response whose inside is malformed: the SDK quoted it back under "server-error" too.
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"secret"}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"m"}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":true,"message":"m"}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":1}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":["m"]}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"result":null}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"result":["secret"]}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"result":"x"}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","result":{}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","method":"notifications/x","error":{"code":1,"message":"m"}}', INVALID_REQUEST),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"min_score":1e400}}', PARSE_ERROR),
        (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"min_score":-1E+999}}', PARSE_ERROR),
        # Over the size whose whole is read again: the same checks, on its skeleton.
        (b'{"jsonrpc":"2.0","id":1,' + b" " * REQUEST_CHECK_BYTES, PARSE_ERROR),
        (_padded(b'{"jsonrpc":"2.0","id":1,"result":"secret","pad":"%s"}'), INVALID_REQUEST),
        (_padded(b'{"jsonrpc":"2.0","id":1,"error":{"code":"x","message":"%s"}}'), INVALID_REQUEST),
        (_padded(b'[{"jsonrpc":"2.0","id":1,"method":"ping","params":{"p":"%s"}}]'), INVALID_REQUEST),
        (_padded(b'{"jsonrpc":"1.0","id":1,"method":"ping","params":{"p":"%s"}}'), INVALID_REQUEST),
        (_padded(b'{"jsonrpc":"2.0","id":null,"method":"ping","params":{"p":"%s"}}'), INVALID_REQUEST),
        (_padded(b'{"jsonrpc":"2.0","id":1,"method":"x","result":{},"params":{"p":"%s"}}'), INVALID_REQUEST),
        (_padded(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"s":NaN,"p":"%s"}}'), PARSE_ERROR),
        (_padded(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"s":1e400,"p":"%s"}}'), PARSE_ERROR),
        (_ingest(b'"text \\ud800 and more"'), PARSE_ERROR),
        # What the SDK's parser refuses in a long string, and a lone surrogate there (a 500).
        (_padded(b'{"jsonrpc":"2.0","id":"%s\\ud800","method":"ping"}'), PARSE_ERROR),
        (_padded(b'{"jsonrpc":"2.0","id":1,"method":"%s\\udc00"}'), PARSE_ERROR),
        (_ingest(b'"' + b"a" * 2000 + b'\n raw"'), PARSE_ERROR),
        (_ingest(b'"' + b"a" * 2000 + b'\\x"'), PARSE_ERROR),
        (_ingest(b'"' + b"a" * 2000 + b'\\u12G4"'), PARSE_ERROR),
    ],
)
def test_a_body_the_sdk_would_answer_badly_gets_its_json_rpc_error(body: bytes, code: int) -> None:
    refused = rejection(body)
    assert refused is not None
    assert refused[0] == code


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":"a","method":"ping"}',
        b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
        b'\xef\xbb\xbf{"jsonrpc":"2.0","id":1,"method":"ping"}',
        b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"q":"\\ud83d\\ude00 \\\\ud800"}}',
        b'{"jsonrpc":"2.0","id":7,"result":{}}',
        b'{"jsonrpc":"2.0","id":7,"error":{"code":-1,"message":"no"}}',
        b'{"jsonrpc":"2.0","id":"r","result":{"roots":[]}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"q":"NaN Infinity","n":1e308}}',
        b'{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no","data":[1]}}',
        # An ingest's content: only its skeleton is parsed a second time on the event loop.
        _ingest(b'"' + b"ab[{1e400 NaN" * (REQUEST_CHECK_BYTES // 10) + b'"'),
        _ingest(b'"' + b"a" * 2000 + b'\\ud83d\\ude00 \\\\ud800 \\" \\n \xc3\xa9"'),
    ],
    ids=[
        "integer-id",
        "string-id",
        "notification",
        "bom",
        "surrogate-pair-and-escaped-backslash",
        "client-result",
        "client-error",
        "client-result-with-fields",
        "nan-as-text",
        "client-error-with-data",
        "over-the-check",
        "over-the-check-escapes",
    ],
)
def test_a_message_the_sdk_answers_itself_is_let_by(body: bytes) -> None:
    assert rejection(body) is None

"""What the MCP body check refuses before the SDK's parser, which would crash on it, and what it lets by."""

from __future__ import annotations

from services.mcp.sessions import MAX_NUMBER_DIGITS, unparseable


def test_a_number_python_will_not_read_is_refused_but_digits_in_a_string_are_text() -> None:
    digits = "9" * (MAX_NUMBER_DIGITS + 1)
    refused = unparseable(f'{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"n":{digits}}}}}'.encode())
    assert refused == f"a number of more than {MAX_NUMBER_DIGITS} digits"
    assert (
        unparseable(f'{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"n":"{digits}"}}}}'.encode()) is None
    )
    assert unparseable(f'{{"n":{"9" * MAX_NUMBER_DIGITS}}}'.encode()) is None

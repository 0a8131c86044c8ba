"""What the MCP `ingest` tool makes of its content before anything is stored."""

from __future__ import annotations

import pytest

from services.mcp.tools import _payload
from shared.errors import ErrorCode, RaglineError
from shared.ingest import text_filename


def test_content_with_a_lone_surrogate_is_refused_as_invalid() -> None:
    # JSON lets "\udc00" through; a body over the protocol check reached here and failed INTERNAL.
    with pytest.raises(RaglineError) as refused:
        _payload("notes \udc00 end", None, 1 << 20)
    assert refused.value.code == ErrorCode.INVALID_ARGUMENT


def test_text_and_base64_content_become_bytes() -> None:
    assert _payload("héron", None, 100) == "héron".encode()
    assert _payload(None, "aMOpcm9u", 100) == "héron".encode()


def test_text_takes_its_name_from_its_doc_id() -> None:
    assert text_filename("team/notes.md") == "notes.md"
    assert text_filename("note") == "note"
    assert text_filename(None) is None  # the id comes from the content's hash
    assert text_filename("dir/") is None

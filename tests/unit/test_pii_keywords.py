"""Keywords come from the text as indexed: no fragment of a redacted value, no placeholder."""

from __future__ import annotations

from workers.stages.pii import with_keywords


def test_keywords_hold_no_fragment_of_a_replaced_value_and_no_placeholder() -> None:
    chunks = [
        {"text": "Escalation for <EMAIL_ADDRESS> about the invoice; call <PHONE_NUMBER:0a1b2c3d4e5f>."},
        {"text": "The invoice was paid by <PERSON> and the escalation closed."},
    ]
    artifact = with_keywords({"chunks": chunks, "title": "Escalation"})
    words = {w for c in artifact["chunks"] for w in c["keywords"]} | set(artifact["keywords"])
    assert "escalation" in words
    assert "invoice" in words
    assert not {w for w in words if "email" in w or "phone" in w or "person" in w or "0a1b" in w}
    assert [c["text"] for c in artifact["chunks"]] == [c["text"] for c in chunks]

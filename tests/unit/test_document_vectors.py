"""The whole-document fields on a document's first chunk, at ingest and when a reembed copies them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from workers.reembed import _HeldDocument
from workers.stages.store import DOCUMENT_TEXT_CHARS, document_fields, mean_direction, with_document_fields


def _chunk(doc: str, idx: int, vector: list[float], generation: int = 1) -> dict[str, Any]:
    source: dict[str, Any] = {"doc_id": doc, "generation": generation, "chunk_idx": idx, "embedding": vector}
    source["text"] = f"{doc} part {idx}"
    return source


def test_first_chunk_gets_the_text_and_the_normalized_mean() -> None:
    sources = [(f"id{i}", _chunk("d", i, v)) for i, v in enumerate([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])]
    first, *rest = with_document_fields(sources)
    assert first[1]["document_text"] == "d part 0\n\nd part 1\n\nd part 2"
    assert first[1]["document_embedding"] == pytest.approx([2**-0.5, 2**-0.5])
    assert all("document_text" not in s and "document_embedding" not in s for _, s in rest)
    assert with_document_fields([]) == []


def test_a_zero_mean_has_no_vector_and_long_text_is_capped() -> None:
    assert mean_direction([[1.0, 0.0], [-1.0, 0.0]]) is None
    fields = document_fields(["x" * DOCUMENT_TEXT_CHARS, "tail"], [[1.0, 0.0], [-1.0, 0.0]])
    assert len(fields["document_text"]) == DOCUMENT_TEXT_CHARS
    assert "document_embedding" not in fields


def test_reembed_holds_each_first_chunk_until_its_document_is_complete() -> None:
    held = _HeldDocument()
    a0 = {**_chunk("a", 0, [1.0, 0.0]), "document_text": "a"}
    b0 = {**_chunk("b", 0, [0.0, 2.0]), "document_text": "b"}
    written: list[tuple[str, dict[str, Any]]] = []
    written += held.take("a0", a0)
    assert written == []  # a's first chunk waits for the rest of a
    written += held.take("a1", _chunk("a", 1, [0.0, 1.0]))
    assert [i for i, _ in written] == ["a1"]
    written += held.take("b0", b0)  # b starts: a is complete
    assert [i for i, _ in written] == ["a1", "a0"]
    assert written[1][1]["document_embedding"] == pytest.approx([2**-0.5, 2**-0.5])
    written += held.take("b1", _chunk("b", 1, [0.0, 1.0]))
    last = held.release()
    assert [i for i, _ in last] == ["b0"]
    assert np.allclose(last[0][1]["document_embedding"], [0.0, 1.0])
    assert held.release() == []


def test_reembed_passes_chunks_of_documents_stored_before_document_fields() -> None:
    held = _HeldDocument()
    written = held.take("o0", _chunk("old", 0, [1.0, 0.0])) + held.take("o1", _chunk("old", 1, [0.0, 1.0]))
    assert [i for i, _ in written] == ["o0", "o1"]
    assert held.release() == []

"""The chunk index body new indexes get: vectors only in the vector files, compressed stored fields."""

from __future__ import annotations

from typing import Any

from shared.config import Settings
from shared.search.schema import LAYOUT, VECTOR_FIELDS, chunk_index_body, chunks_index


def _body(settings: Settings) -> dict[str, Any]:
    return chunk_index_body(settings, settings.embedding.model, settings.embedding.dimension, {})


def test_every_vector_field_is_left_out_of_source_and_doc_values(settings: Settings) -> None:
    mappings = _body(settings)["mappings"]
    vectors = sorted(name for name, field in mappings["properties"].items() if field["type"] == "knn_vector")
    assert vectors == sorted(VECTOR_FIELDS)
    assert mappings["_source"] == {"excludes": VECTOR_FIELDS}
    assert all(mappings["properties"][name]["doc_values"] is False for name in vectors)


def test_stored_fields_are_compressed_and_the_document_text_has_no_positions(settings: Settings) -> None:
    body = _body(settings)
    assert body["settings"]["index"]["codec"] == "best_compression"
    assert body["mappings"]["properties"]["document_text"]["index_options"] == "freqs"
    # The chunks' own text keeps positions (the default), and with them phrase queries.
    assert "index_options" not in body["mappings"]["properties"]["text"]


def test_the_shared_index_of_the_current_layout_has_a_name_of_its_own(settings: Settings) -> None:
    model = settings.embedding.model
    assert chunks_index(settings, model) == chunks_index(settings, model, LAYOUT)
    assert chunks_index(settings, model) != chunks_index(settings, model, 1)

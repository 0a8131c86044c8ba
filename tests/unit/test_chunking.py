"""Chunking in the model's tokens: budgets, sections, overlap, offsets."""

from __future__ import annotations

from typing import Any

from shared.config import load_settings
from shared.embedding import HEADER_TOKEN_BUDGET, SPECIAL_TOKENS, token_counter
from workers.stages.chunk import chunk_elements

COUNTER = token_counter(load_settings().embedding)


def _el(
    text: str, kind: str = "NarrativeText", depth: int | None = None, page: int | None = None
) -> dict[str, Any]:
    return {"text": text, "type": kind, "category_depth": depth, "page_number": page, "page_label": None}


def _words(count: int, word: str) -> str:
    return " ".join(f"{word}{i}" for i in range(count)) + "."


def test_sections_start_new_chunks_and_carry_their_heading_path() -> None:
    elements = [
        _el("Manual", "Title", 0),
        _el(_words(80, "intro")),
        _el("Setup", "Title", 1),
        _el(_words(80, "install")),
        _el("Usage", "Title", 1),
        _el("Run it."),
    ]
    parsed, chunks = chunk_elements(elements, 256, 32, COUNTER)
    assert [c["headings"] for c in chunks] == [["Manual"], ["Manual", "Setup"], ["Manual", "Usage"]]
    assert chunks[1]["text"] == "Setup\n\n" + _words(80, "install")
    assert chunks[2]["text"] == "Usage\n\nRun it."  # no overlap carried across a section start
    for chunk in chunks:
        assert parsed[chunk["char_start"] : chunk["char_end"]] == chunk["text"]


def test_small_sections_share_a_chunk_headed_by_the_section_holding_most_of_it() -> None:
    elements = [
        _el("Manual", "Title", 0),
        _el("SYNOPSIS", "Title", 1),
        _el("tool [options] file"),
        _el("NOTES", "Title", 1),
        _el(_words(60, "note")),
    ]
    parsed, chunks = chunk_elements(elements, 256, 32, COUNTER)
    assert len(chunks) == 1
    assert chunks[0]["headings"] == ["Manual", "NOTES"]
    assert parsed[chunks[0]["char_start"] : chunks[0]["char_end"]] == parsed


def test_long_text_respects_the_budget_and_overlaps() -> None:
    sentences = " ".join(f"Sentence number {i} describes widget {i * 7} in detail." for i in range(200))
    _, chunks = chunk_elements([_el(sentences)], 128, 24, COUNTER)
    budget = 128 - SPECIAL_TOKENS - HEADER_TOKEN_BUDGET
    assert len(chunks) > 5
    assert max(COUNTER.count([c["text"] for c in chunks])) <= budget
    # consecutive chunks share their boundary sentences
    assert all(chunks[i]["char_start"] < chunks[i - 1]["char_end"] for i in range(1, len(chunks)))


def test_a_single_unbreakable_run_is_cut_at_token_boundaries() -> None:
    blob = "x" * 5000  # no sentence or line breaks at all
    _, chunks = chunk_elements([_el(blob)], 256, 0, COUNTER)
    assert "".join(c["text"] for c in chunks) == blob
    assert max(COUNTER.count([c["text"] for c in chunks])) <= 256 - SPECIAL_TOKENS - HEADER_TOKEN_BUDGET


def test_a_small_section_on_a_new_page_still_starts_a_chunk() -> None:
    elements = [
        _el("One", "Title", 0, page=1),
        _el("Short page.", page=1),
        _el("Two", "Title", 0, page=2),
        _el("Another short page.", page=2),
    ]
    _, chunks = chunk_elements(elements, 256, 32, COUNTER)
    assert [(c["page_num"], c["headings"]) for c in chunks] == [(1, ["One"]), (2, ["Two"])]


def test_pages_are_kept() -> None:
    elements = [_el("Page one text. " * 80, page=1), _el("Page two text. " * 80, page=2)]
    _, chunks = chunk_elements(elements, 256, 0, COUNTER)
    assert {c["page_num"] for c in chunks} == {1, 2}

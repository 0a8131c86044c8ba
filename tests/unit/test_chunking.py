"""Chunking in the model's tokens: budgets, sections, overlap, offsets."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from shared.config import load_settings
from shared.embedding import HEADER_TOKEN_BUDGET, SPECIAL_TOKENS, token_counter
from workers.stages.chunk import body_budget, chunk_elements, max_chars

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


def _assert_bounded_and_complete(
    elements: list[dict[str, Any]], parsed: str, chunks: list[dict[str, Any]], chunk_size: int
) -> None:
    """Every chunk within the budget in tokens and in characters, true to its offsets, and every
    visible character of the text in some chunk, but for a title's that the heading path of a
    chunk holds whole."""
    budget = body_budget(chunk_size, COUNTER.max_seq_length)
    covered = bytearray(len(parsed))
    paths = {heading for chunk in chunks for heading in chunk["headings"]}
    for chunk in chunks:
        assert parsed[chunk["char_start"] : chunk["char_end"]] == chunk["text"]
        assert len(chunk["text"]) <= max_chars(budget)
        assert COUNTER.count([chunk["text"]])[0] <= budget
        covered[chunk["char_start"] : chunk["char_end"]] = b"\x01" * len(chunk["text"])
    offset = 0
    for element in elements:
        text = element["text"]
        if element["type"] == "Title" and " ".join(text.split()) in paths:
            covered[offset : offset + len(text)] = b"\x01" * len(text)
        offset += len(text) + 2
    assert all(covered[i] or parsed[i].isspace() for i in range(len(parsed)))


def test_a_megabyte_line_is_cut_to_chunks_of_bounded_size() -> None:
    # The tokenizer reads a word of over 100 characters as one unknown token: a CSV row of
    # megabytes made a single chunk that OpenSearch then refused to highlight.
    row = "x" * 2_000_000 + ",1"
    elements = [_el("a,b"), _el(row), _el("Trailing words after the row.")]
    parsed, chunks = chunk_elements(elements, 256, 32, COUNTER)
    _assert_bounded_and_complete(elements, parsed, chunks, 256)
    assert len(chunks) >= 2_000_000 // max_chars(body_budget(256, COUNTER.max_seq_length))


def test_a_long_token_among_words_and_a_long_gap_stay_bounded() -> None:
    text = "word " * 10 + "y" * 300_000 + " tail." + " " * 50_000 + "Next sentence here."
    elements = [_el(text)]
    parsed, chunks = chunk_elements(elements, 128, 24, COUNTER)
    _assert_bounded_and_complete(elements, parsed, chunks, 128)
    assert chunks[0]["text"].startswith("word word")
    assert chunks[-1]["text"].endswith("Next sentence here.")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet=st.sampled_from("ab .\n,\ufffd\u200b\u0301\ue000"), max_size=400),
            st.integers(min_value=90, max_value=6000).map(lambda n: "z" * n),
            st.integers(min_value=1, max_value=6000).map(lambda n: "\ufffd" * n),
            st.integers(min_value=1, max_value=6000).map(lambda n: " " * n),
            st.sampled_from(["Heading", "Section two", "Sentence one. Sentence two!"]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([64, 128, 256]),
)
def test_any_text_makes_bounded_chunks_that_cover_it(parts: list[str], chunk_size: int) -> None:
    elements = [_el(p, "Title" if i % 4 == 0 else "NarrativeText", 1) for i, p in enumerate(parts)]
    parsed, chunks = chunk_elements(elements, chunk_size, 16, COUNTER)
    _assert_bounded_and_complete(elements, parsed, chunks, chunk_size)


def test_sibling_headings_and_text_the_tokenizer_drops_are_kept() -> None:
    # Headings alone that overflow were dropped when the heading path held only the last of them;
    # runs of characters the tokenizer reads as nothing were cut out between tokens.
    elements = [_el(f"Section {i} siblingword{i} " + "q" * 180, "Title", 2) for i in range(40)]
    elements += [_el("Body text. " + "\ufffd" * 10_000 + " tailword.")]
    parsed, chunks = chunk_elements(elements, 256, 32, COUNTER)
    _assert_bounded_and_complete(elements, parsed, chunks, 256)
    joined = "".join(c["text"] for c in chunks)
    assert all(f"siblingword{i} " in joined for i in range(39))
    assert joined.count("\ufffd") == 10_000


def test_a_heading_before_a_long_block_leads_it_without_a_chunk_of_its_own() -> None:
    elements = [_el("Usage", "Title", 1), _el(" ".join(f"flag{i}" for i in range(3000)))]  # no sentence ends
    _, chunks = chunk_elements(elements, 256, 32, COUNTER)
    assert all(c["headings"] == ["Usage"] for c in chunks)
    assert not any(c["text"] == "Usage" for c in chunks)


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

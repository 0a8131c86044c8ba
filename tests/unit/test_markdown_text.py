"""Markdown by its own markup: structure kept, markup dropped, no text lost, deep nesting refused."""

from __future__ import annotations

import re

import pytest

from shared.errors import ErrorCode, PermanentError
from workers.stages.markdown_text import MAX_NESTING, markdown_elements

GUIDE = """---
title: "Ferry handbook"
date: 2024-05-01
---

Ferry Guide
===========

The **ferry** leaves at *dawn*; see [the timetable](https://example.org/times) &amp; `ferryctl`.
A soft break continues the paragraph.

## Boarding

1. Buy a ticket.
2. Show it at the gate:
   - paper tickets are scanned
   - phone tickets need light

> Harbour rule: no bicycles on the upper deck.

```sh
ferryctl board --deck lower
```

| Deck | Seats |
|------|------:|
| lower | 120 |
| upper | 80 |

<div align="center"><img src="logo.png" alt="logo"> Made by the harbour&nbsp;team</div>

### Fog ![warning](w.png)

Sailings wait while visibility is under 200 m.
"""


def kinds(text: str) -> list[tuple[str, str, int | None]]:
    return [(e["type"], e["text"], e["category_depth"]) for e in markdown_elements(text)]


def test_structure_is_read_from_the_markup() -> None:
    assert kinds(GUIDE) == [
        ("Title", "Ferry handbook", 0),
        ("Title", "Ferry Guide", 0),
        (
            "NarrativeText",
            "The ferry leaves at dawn; see the timetable & ferryctl.\nA soft break continues the paragraph.",
            None,
        ),
        ("Title", "Boarding", 1),
        ("ListItem", "Buy a ticket.", None),
        ("ListItem", "Show it at the gate:", None),
        ("ListItem", "paper tickets are scanned", None),
        ("ListItem", "phone tickets need light", None),
        ("NarrativeText", "Harbour rule: no bicycles on the upper deck.", None),
        ("CodeSnippet", "ferryctl board --deck lower", None),
        ("Table", "Deck | Seats\nlower | 120\nupper | 80", None),
        ("NarrativeText", "Made by the harbour team", None),
        ("Title", "Fog warning", 2),
        ("NarrativeText", "Sailings wait while visibility is under 200 m.", None),
    ]


def test_no_word_of_the_text_is_lost() -> None:
    # Every word outside link targets, tags and front matter keys comes out somewhere.
    prose = re.sub(r"\]\([^)]*\)|<[^>]*>|^(date|title):.*$", " ", GUIDE, flags=re.M)
    words = set(re.findall(r"[A-Za-z]{3,}", prose)) - {"amp", "nbsp"}
    found = set(re.findall(r"[A-Za-z]{3,}", " ".join(e["text"] for e in markdown_elements(GUIDE))))
    assert words - found == set()


def test_line_endings_and_a_missing_front_matter_change_nothing() -> None:
    text = "# Title\n\nBody line.\n"
    assert (
        kinds(text.replace("\n", "\r\n"))
        == kinds(text)
        == [
            ("Title", "Title", 0),
            ("NarrativeText", "Body line.", None),
        ]
    )


def test_text_between_two_rules_is_not_taken_for_front_matter() -> None:
    text = "---\n\n# Ferry notes\n\nThe ferry leaves at dawn.\n\n---\n\nReturns by dusk.\n"
    assert [e["text"] for e in markdown_elements(text)] == [
        "Ferry notes",
        "The ferry leaves at dawn.",
        "Returns by dusk.",
    ]
    toml = '+++\ntitle = "Tide tables"\n[params]\ntags = ["sea"]\n+++\n\nHigh water at noon.\n'
    assert kinds(toml) == [("Title", "Tide tables", 0), ("NarrativeText", "High water at noon.", None)]


@pytest.mark.parametrize("marker", ["> ", "- "])
def test_blocks_nested_past_the_limit_are_refused_not_dropped(marker: str) -> None:
    deep = marker * (MAX_NESTING + 5) + "the innermost line\n\nafter it\n"
    with pytest.raises(PermanentError) as refused:
        markdown_elements(deep)
    assert refused.value.code == ErrorCode.PARSE_ERROR
    shallow = marker * 10 + "ten levels are fine\n"
    assert [e["text"] for e in markdown_elements(shallow)] == ["ten levels are fine"]


def test_many_unclosed_comment_openers_are_read_in_linear_time() -> None:
    # Tags were stripped with "<[^>]*>": each "<" without a ">" after it scanned to the end of the
    # block, and a file of 800 KB like this one ran for minutes.
    elements = markdown_elements("<!--" * 200_000 + "\n\n# After\n\ntext")
    # An unclosed comment runs to the end of the document (CommonMark's HTML block of kind 2);
    # its words are still kept.
    assert elements[-1]["text"].endswith("<!-- # After text")

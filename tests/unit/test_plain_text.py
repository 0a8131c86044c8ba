"""Plain text is read by its layout: which lines are headings, at what depth, and what is prose."""

from __future__ import annotations

from typing import Any

from workers.stages.plain_text import text_elements

MAN_PAGE = """\
mkfifo

SYNOPSIS
       mkfifo [OPTION]... NAME...

DESCRIPTION
       Create named pipes (FIFOs) with the given NAMEs, which other programs
       open like any other file.

OPTIONS
   Mode options
       -m, --mode=MODE
              set file permission bits to MODE, not a=rw - umask

       •  A bullet item that wraps onto
          a second line.

   Other options
       --help display this help and exit
"""


def titles(elements: list[dict[str, Any]]) -> list[tuple[str, int]]:
    return [(e["text"], e["category_depth"]) for e in elements if e["type"] == "Title"]


def test_man_page_sections_are_headings_and_option_names_are_not() -> None:
    elements = text_elements(MAN_PAGE)
    assert titles(elements) == [
        ("mkfifo", 0),
        ("SYNOPSIS", 1),
        ("DESCRIPTION", 1),
        ("OPTIONS", 1),
        ("Mode options", 2),
        ("Other options", 2),
    ]
    texts = [e["text"] for e in elements if e["type"] != "Title"]
    # A term and its indented description are one paragraph, wrapped lines are joined.
    assert "-m, --mode=MODE set file permission bits to MODE, not a=rw - umask" in texts
    assert (
        "Create named pipes (FIFOs) with the given NAMEs, which other programs open like any other file."
        in texts
    )
    bullets = [e["text"] for e in elements if e["type"] == "ListItem"]
    assert bullets == ["•  A bullet item that wraps onto a second line."]


def test_underlined_headings_take_their_depth_from_first_appearance() -> None:
    text = (
        "User Guide\n==========\n\nIntro sentence for the guide.\n\n"
        "Install\n-------\n\nRun the installer.\n\n"
        "Upgrade\n-------\n\nRun it again.\n\n"
        "Reference\n=========\n\nThe rest.\n"
    )
    assert titles(text_elements(text)) == [
        ("User Guide", 0),
        ("Install", 1),
        ("Upgrade", 1),
        ("Reference", 0),
    ]
    assert all(set(e["text"]) - set("=-") for e in text_elements(text))  # underlines are not text


def test_numbered_capital_and_title_case_lines_alone_are_headings_sentences_are_not() -> None:
    text = (
        "the opening line of a memo, which is a sentence.\n\n"
        "1. Introduction\n\nWhy this memo exists.\n\n"
        "1.1 Scope Of Work\n\nWhat it covers.\n\n"
        "2. install the package first\n\n"
        "RESULTS\n\nIt worked.\n\n"
        "This line is a sentence.\n\n"
        "Open Questions\n\nNone yet.\n"
    )
    assert titles(text_elements(text)) == [
        ("1. Introduction", 0),
        ("1.1 Scope Of Work", 1),
        ("RESULTS", 2),
        ("Open Questions", 3),
    ]
    items = [e["text"] for e in text_elements(text) if e["type"] == "ListItem"]
    assert items == ["2. install the package first"]


def test_a_lone_first_line_is_the_title_and_prose_lines_never_are() -> None:
    text = "quarterly report\n\nRevenue rose in every region this quarter, led by the north.\nmore text\n"
    elements = text_elements(text)
    assert titles(elements) == [("quarterly report", 0)]
    assert elements[1]["text"].endswith("led by the north. more text")


def test_form_feeds_number_the_pages() -> None:
    elements = text_elements("Page one text here.\fPage two text here.\n\fPage three.")
    assert [(e["text"], e["page_number"], e["page_label"]) for e in elements] == [
        ("Page one text here.", 1, "1"),
        ("Page two text here.", 2, "2"),
        ("Page three.", 3, "3"),
    ]


def test_text_without_form_feeds_has_no_page_numbers_and_windows_newlines_are_lines() -> None:
    elements = text_elements("NOTES\r\n\r\nSome words here.\r\nAnd more.\r\n")
    assert [(e["text"], e["type"], e["page_number"]) for e in elements] == [
        ("NOTES", "Title", None),
        ("Some words here. And more.", "NarrativeText", None),
    ]

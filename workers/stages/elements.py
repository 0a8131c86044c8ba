"""The parsed-element record every partitioner returns, whatever the file's kind."""

from __future__ import annotations

from typing import Any

Element = dict[str, Any]


def element(
    text: str, kind: str, page: int | None = None, label: str | None = None, depth: int | None = None
) -> Element:
    """One element: its text, its type (unstructured's category names: Title, NarrativeText,
    ListItem, Table, ...), its page and page label, and a title's depth."""
    return {"text": text, "type": kind, "page_number": page, "page_label": label, "category_depth": depth}

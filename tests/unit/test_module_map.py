"""docs/architecture.md's module map lists every module of the tree with its docstring's summary."""

from __future__ import annotations

from tests.unit.module_map import PAGE, modules, render, section, summary


def test_every_module_has_a_docstring_summary() -> None:
    missing = [str(p) for p in modules() if not summary(p)]
    assert missing == [], f"modules without a docstring: {missing}"


def test_the_module_map_matches_the_tree() -> None:
    page = PAGE.read_text(encoding="utf-8")
    assert section(page) == render(), "run: python -m tests.unit.module_map"

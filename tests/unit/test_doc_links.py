"""Every relative link in README.md and docs/*.md points at a file of the repository, and an anchor at
one of that file's headings."""

from __future__ import annotations

import re
from pathlib import Path

from shared.config import REPO_ROOT

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    body = _FENCE.sub("", page.read_text())
    return {anchor(line.lstrip("#")) for line in body.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(page: Path) -> list[str]:
    """The relative links of a page whose file or heading does not exist."""
    broken = []
    for target in _LINK.findall(_FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (fragment and file.suffix == ".md" and fragment not in _anchors(file)):
            broken.append(target)
    return broken


def test_anchor_follows_the_github_rule() -> None:
    assert anchor("A local cluster and specialised workers") == "a-local-cluster-and-specialised-workers"
    assert anchor("`opensearch`") == "opensearch"
    assert anchor("REST API: keys, routes") == "rest-api-keys-routes"


def test_every_relative_link_resolves() -> None:
    broken = {page.name: links for page in _pages() if (links := broken_links(page))}
    assert broken == {}


_CITATION = re.compile(r"\b(docs/[\w\-]+\.md)(?:#([\w\-]+))?")


def broken_citations(source: Path) -> list[str]:
    """The `docs/<page>.md#anchor` citations in a source file whose page or heading does not exist."""
    broken = []
    for path, fragment in _CITATION.findall(source.read_text(encoding="utf-8")):
        page = REPO_ROOT / path
        if not page.exists() or (fragment and fragment not in _anchors(page)):
            broken.append(f"{path}#{fragment}" if fragment else path)
    return broken


def test_code_cites_pages_and_headings_that_exist() -> None:
    sources = [
        p
        for pkg in ("shared", "services", "workers", "client", "bench", "deploy")
        for p in (REPO_ROOT / pkg).rglob("*.py")
        if "__pycache__" not in p.parts
    ]
    broken = {str(p.relative_to(REPO_ROOT)): found for p in sources if (found := broken_citations(p))}
    assert broken == {}


def test_a_citation_of_a_missing_heading_is_found(tmp_path: Path) -> None:
    source = tmp_path / "cites.py"
    source.write_text(
        '"""See docs/architecture.md#pipeline-stages and docs/architecture.md#no-such-part."""\n'
    )
    assert broken_citations(source) == ["docs/architecture.md#no-such-part"]

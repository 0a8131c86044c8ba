"""The architecture's import rules (DESIGN.md section 2), checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import shared

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"services": {"workers"}, "workers": {"services"}, "shared": {"services", "workers"}}


def _imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_does_not_import_its_forbidden_neighbours(package: str) -> None:
    sources = sorted((REPO / package).rglob("*.py"))
    assert sources, f"no sources found under {package}/"
    offenders = {
        str(path.relative_to(REPO)): sorted(_imported_roots(path) & FORBIDDEN[package]) for path in sources
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_shared_is_the_package_inside_this_repository() -> None:
    # ../shared beside the checkout is the team handbook; it must never shadow the package.
    assert Path(shared.__file__).resolve().is_relative_to(REPO)
    assert Path(shared.__file__).resolve().parent == REPO / "shared"

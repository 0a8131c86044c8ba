"""The README's configuration reference names every setting the code reads."""

from __future__ import annotations

import re

from pydantic import BaseModel

from shared.config import REPO_ROOT, Settings


def _variables(model: type[BaseModel], prefix: str) -> list[str]:
    names = []
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            names += _variables(kind, f"{prefix}{name.upper()}__")
        else:
            names.append(f"{prefix}{name.upper()}")
    return names


def test_every_setting_has_a_row_in_the_configuration_reference() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Configuration reference", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `RAGLINE_")]
    missing = []
    for variable in _variables(Settings, "RAGLINE_"):
        section_prefix, _, field = variable.rpartition("__")
        in_a_row = any(
            f"`{variable}`" in row
            or (f"`{section_prefix}__" in row and re.search(rf"`__{re.escape(field)}`", row))
            for row in rows
        )
        if not in_a_row:
            missing.append(variable)
    assert missing == []

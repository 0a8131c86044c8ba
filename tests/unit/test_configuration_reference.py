"""docs/configuration.md is the generator's output, and every setting the code reads has a description."""

from __future__ import annotations

from shared.config import REPO_ROOT
from shared.config_reference import render, undocumented


def test_the_configuration_page_is_the_generated_reference() -> None:
    page = (REPO_ROOT / "docs" / "configuration.md").read_text()
    assert page == render(), "run: python -m shared.config_reference > docs/configuration.md"


def test_every_setting_has_a_description() -> None:
    assert undocumented() == []


def test_every_setting_has_a_row_in_the_reference() -> None:
    page = render()
    for variable in ("RAGLINE_STATE_DIR", "RAGLINE_OPENSEARCH__URL", "RAGLINE_API__MAX_METADATA_BYTES"):
        assert f"| `{variable}` |" in page

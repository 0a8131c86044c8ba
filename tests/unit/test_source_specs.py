"""What a source's spec refuses before anything reaches a worker (no services)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from shared.sources.models import SourceSpec

SPECS: TypeAdapter[Any] = TypeAdapter(SourceSpec)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"type": "folder", "settings": {"path": "/srv/share/a\x00b"}}, "path"),
        ({"type": "git", "settings": {"url": "/srv/share/repo\x00"}}, "url"),
        ({"type": "git", "settings": {"url": "https://git.example/r\x00.git"}}, "url"),
        ({"type": "web", "settings": {"url": "https://docs.example/\x00"}}, "url"),
        (
            {
                "type": "web",
                "settings": {"url": "https://docs.example/", "prefix": "https://docs.example/\x00"},
            },
            "prefix",
        ),
        ({"type": "s3", "settings": {"bucket": "docs", "prefix": "manuals/\x00"}}, "prefix"),
        (
            {"type": "s3", "settings": {"bucket": "docs", "endpoint_url": "http://127.0.0.1:9000\x00"}},
            "endpoint_url",
        ),
    ],
)
def test_a_nul_character_in_a_path_or_url_is_refused(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        SPECS.validate_python(spec)
    [error] = refused.value.errors()
    assert error["loc"][-1] == field
    assert "NUL" in error["msg"]


def test_the_same_settings_without_it_are_taken() -> None:
    assert SPECS.validate_python({"type": "folder", "settings": {"path": "/srv/share/a b"}})
    assert SPECS.validate_python({"type": "s3", "settings": {"bucket": "docs", "prefix": "manuals/"}})

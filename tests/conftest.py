"""Fixtures shared by every test layer."""

from __future__ import annotations

import pytest

from shared.config import Settings, load_settings


@pytest.fixture(scope="session")
def settings() -> Settings:
    return load_settings()

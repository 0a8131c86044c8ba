"""API keys: expiry, revocation, reloading the keys file, and secrets kept out of messages."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from services.core.auth import KeyRing, Role
from shared.config import AuthSettings, ConfigError, load_settings
from shared.errors import ErrorCode, RaglineError

SECRET = "unit-secret-0123456789abcdef"
OTHER = "unit-other-0123456789abcdef"


def _entry(key: str, **extra: Any) -> dict[str, Any]:
    return {"key": key, "tenant": "acme", "role": "write", "name": "ci", **extra}


def _ring(tmp_path: Path, *entries: dict[str, Any]) -> tuple[KeyRing, Path]:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps(list(entries)))
    return KeyRing(AuthSettings(keys_file=keys_file), "default"), keys_file


def _refusal(ring: KeyRing, key: str | None) -> str:
    with pytest.raises(RaglineError) as caught:
        ring.principal(key)
    assert caught.value.code is ErrorCode.AUTH_ERROR
    return caught.value.message


def test_a_valid_key_maps_to_its_tenant_and_role(tmp_path: Path) -> None:
    ring, _ = _ring(tmp_path, _entry(SECRET))
    principal = ring.principal(SECRET)
    assert (principal.tenant, principal.role, principal.name) == ("acme", Role.WRITE, "ci")


def test_missing_wrong_revoked_and_expired_keys_are_refused(tmp_path: Path) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    ring, _ = _ring(
        tmp_path,
        _entry(SECRET, revoked=True),
        _entry(OTHER, expires_at=past),
        _entry("unit-later-0123456789abcdef", expires_at=future),
    )
    assert "required" in _refusal(ring, None)
    assert "not valid" in _refusal(ring, "unit-wrong-0123456789abcdef")
    assert "revoked" in _refusal(ring, SECRET)
    assert "expired" in _refusal(ring, OTHER)
    assert ring.principal("unit-later-0123456789abcdef").tenant == "acme"


def test_static_keys_expire_too() -> None:
    past = datetime.now(UTC) - timedelta(seconds=1)
    ring = KeyRing(AuthSettings.model_validate({"api_keys": [_entry(SECRET, expires_at=past)]}), "default")
    assert "expired" in _refusal(ring, SECRET)


def test_edits_of_the_keys_file_apply_without_a_restart(tmp_path: Path) -> None:
    ring, keys_file = _ring(tmp_path, _entry(SECRET))
    assert ring.principal(SECRET).tenant == "acme"
    # Same size, written within the same clock tick: neither size nor mtime tells the change.
    keys_file.write_text(json.dumps([_entry(SECRET, revoked=False)]))
    assert ring.principal(SECRET).tenant == "acme"
    keys_file.write_text(json.dumps([_entry(SECRET, revoked=True)]) + " ")
    assert "revoked" in _refusal(ring, SECRET)
    replacement = tmp_path / "keys.new"
    replacement.write_text(json.dumps([_entry(SECRET), _entry(OTHER)]))
    os.replace(replacement, keys_file)
    assert ring.principal(OTHER).tenant == "acme"
    assert ring.principal(SECRET).tenant == "acme"


def test_a_broken_keys_file_keeps_the_last_good_keys(tmp_path: Path) -> None:
    ring, keys_file = _ring(tmp_path, _entry(SECRET))
    keys_file.write_text('[{"key": "' + SECRET[:10])  # half written
    assert ring.principal(SECRET).tenant == "acme"


def test_one_key_listed_for_two_tenants_is_refused_and_never_echoed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Which tenant it was depended on the order of the list: one tenant's key read the other's."""
    alice, bob = _entry(SECRET, tenant="alice", name="alice"), _entry(SECRET, tenant="bob", name="bob")
    with pytest.raises(ConfigError) as caught:
        _ring(tmp_path, alice, bob)
    assert "'alice' and 'bob' are one key" in str(caught.value)
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError):
        KeyRing(AuthSettings.model_validate({"api_keys": [alice, bob]}), "default")
    ring, keys_file = _ring(tmp_path, alice)
    keys_file.write_text(json.dumps([alice, bob]))  # an edit while serving: the last good keys stay
    assert ring.principal(SECRET).tenant == "alice"
    assert ring.principal(SECRET).tenant == "alice"
    said = [r for r in caplog.records if "listed twice" in r.getMessage()]
    assert len(said) == 1  # once, not on every request while the file stays


def test_an_expiry_without_time_zone_is_refused_at_startup_without_echoing_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        _ring(tmp_path, _entry(SECRET, expires_at="2030-01-01T00:00:00"))
    assert "0.expires_at: Input should have timezone info" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_a_bad_key_in_the_environment_is_named_but_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    short = "tooshort-s3cr3t"
    monkeypatch.setenv("RAGLINE_AUTH__API_KEYS", json.dumps([_entry(short)]))
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "RAGLINE_AUTH__API_KEYS__KEY" in message
    assert "at least 16 characters" in message
    assert short not in message

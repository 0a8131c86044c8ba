"""API keys: each maps to a tenant and a role. Requests without a valid key fail closed.

Keys come from settings and from an optional JSON keys file, re-read when it changes, so a key
can be added or revoked without a restart.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from shared.config import ApiKey, AuthSettings, ConfigError
from shared.errors import ErrorCode, RaglineError


class Role(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


@dataclass(frozen=True)
class Principal:
    tenant: str
    role: Role
    name: str


_KEYS = TypeAdapter(list[ApiKey])


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


class KeyRing:
    """Looks up the principal of a presented key (constant-time comparison of digests)."""

    def __init__(self, settings: AuthSettings, anonymous_tenant: str) -> None:
        if settings.allow_anonymous and (settings.api_keys or settings.keys_file):
            raise ConfigError(
                "RAGLINE_AUTH__ALLOW_ANONYMOUS: cannot be true while API keys are configured; choose one"
            )
        if not settings.allow_anonymous and not settings.api_keys and not settings.keys_file:
            raise ConfigError(
                "RAGLINE_AUTH__API_KEYS / RAGLINE_AUTH__KEYS_FILE: no API key is configured; add one, "
                "or set RAGLINE_AUTH__ALLOW_ANONYMOUS=true for local use"
            )
        self.anonymous = (
            Principal(anonymous_tenant, Role.ADMIN, "anonymous") if settings.allow_anonymous else None
        )
        self._static = [self._entry(k) for k in settings.api_keys]
        self._file = settings.keys_file
        self._file_stamp: tuple[float, int] | None = None
        self._file_keys: list[tuple[bytes, Principal]] = []
        self._lock = threading.Lock()
        if self._file is not None:
            self._reload(strict=True)

    @staticmethod
    def _entry(key: ApiKey) -> tuple[bytes, Principal]:
        return _digest(key.key.get_secret_value()), Principal(key.tenant, Role[key.role.upper()], key.name)

    def _reload(self, strict: bool = False) -> None:
        path = Path(self._file) if self._file else None
        if path is None:
            return
        try:
            stat = path.stat()
            stamp = (stat.st_mtime, stat.st_size)
            if stamp == self._file_stamp:
                return
            keys = _KEYS.validate_python(json.loads(path.read_text()))
        except (OSError, ValueError, ValidationError) as error:
            if strict:
                raise ConfigError(
                    f"RAGLINE_AUTH__KEYS_FILE: cannot read {path}: {type(error).__name__}"
                ) from None
            return  # keep the last good keys; a half-written file must not lock everyone out
        with self._lock:
            self._file_keys = [self._entry(k) for k in keys]
            self._file_stamp = stamp

    def principal(self, presented: str | None) -> Principal:
        """The principal of a key, or AUTH_ERROR; the anonymous principal when keys are off."""
        if self.anonymous is not None:
            return self.anonymous
        if not presented:
            raise RaglineError(
                "an API key is required (Authorization: Bearer KEY or X-Api-Key)", code=ErrorCode.AUTH_ERROR
            )
        self._reload()
        digest = _digest(presented)
        match = None
        with self._lock:
            entries = [*self._static, *self._file_keys]
        for known, principal in entries:
            if hmac.compare_digest(known, digest):
                match = principal
        if match is None:
            raise RaglineError("the API key is not valid", code=ErrorCode.AUTH_ERROR)
        return match


def require(principal: Principal, role: Role) -> None:
    if principal.role < role:
        raise RaglineError(f"this needs the {role.name.lower()} role", code=ErrorCode.FORBIDDEN)


def key_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    if x_api_key:
        return x_api_key.strip()
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None

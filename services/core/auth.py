"""API keys: each maps to a tenant and a role. Requests without a valid key fail closed.

Keys come from settings and from an optional JSON keys file, re-read when it changes, so a key
can be added, revoked or given an expiry without a restart. A key's secret is never logged nor
kept in memory: only its SHA-256 digest is.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from shared.config import ApiKey, AuthSettings, ConfigError
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)


class Role(IntEnum):
    READ = 1
    WRITE = 2
    ADMIN = 3


@dataclass(frozen=True)
class Principal:
    tenant: str
    role: Role
    name: str


@dataclass(frozen=True)
class _Entry:
    digest: bytes
    principal: Principal
    expires_at: datetime | None
    revoked: bool


_KEYS = TypeAdapter(list[ApiKey])


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def _problem(error: Exception) -> str:
    """What is wrong with the keys file, by position and field; never a value, which may be a key."""
    if isinstance(error, ValidationError):
        return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:5])
    return type(error).__name__


def _listed_twice(entries: list[_Entry]) -> str | None:
    """What is wrong where one key is listed twice (the names of both entries), else None."""
    seen: dict[bytes, _Entry] = {}
    for entry in entries:
        earlier = seen.setdefault(entry.digest, entry)
        if earlier is not entry:
            return (
                f"the keys named {earlier.principal.name!r} and {entry.principal.name!r} are one key, "
                "listed twice: give each entry a key of its own"
            )
    return None


class KeyRing:
    """Looks up the principal of a presented key (constant-time comparison of digests)."""

    def __init__(self, settings: AuthSettings, anonymous_tenant: str) -> None:
        credentials = settings.api_keys or settings.keys_file or settings.oauth.enabled
        if settings.allow_anonymous and credentials:
            raise ConfigError(
                "RAGLINE_AUTH__ALLOW_ANONYMOUS: cannot be true while API keys or an OAuth issuer are "
                "configured; choose one"
            )
        if not settings.allow_anonymous and not credentials:
            raise ConfigError(
                "RAGLINE_AUTH__API_KEYS / RAGLINE_AUTH__KEYS_FILE / RAGLINE_AUTH__OAUTH__ISSUER: no "
                "credential is configured; add one, or set RAGLINE_AUTH__ALLOW_ANONYMOUS=true for local use"
            )
        self.anonymous = (
            Principal(anonymous_tenant, Role.ADMIN, "anonymous") if settings.allow_anonymous else None
        )
        self._static = [self._entry(k) for k in settings.api_keys]
        if (twice := _listed_twice(self._static)) is not None:
            raise ConfigError(f"RAGLINE_AUTH__API_KEYS: {twice}")
        self._file = settings.keys_file
        self._file_text: bytes | None = None
        self._refused_text: bytes | None = None
        self._file_keys: list[_Entry] = []
        self._lock = threading.Lock()
        if self._file is not None:
            self._reload(strict=True)

    @staticmethod
    def _entry(key: ApiKey) -> _Entry:
        return _Entry(
            digest=_digest(key.key.get_secret_value()),
            principal=Principal(key.tenant, Role[key.role.upper()], key.name),
            expires_at=key.expires_at,
            revoked=key.revoked,
        )

    def _reload(self, strict: bool = False) -> None:
        path = Path(self._file) if self._file else None
        if path is None:
            return
        try:
            # Compare the bytes, not the mtime: two edits within one clock tick share an mtime,
            # and a revocation must never be missed. The file is small; reading it is cheap.
            text = path.read_bytes()
            if text in (self._file_text, self._refused_text):
                return
            keys = _KEYS.validate_python(json.loads(text))
        except (OSError, ValueError, ValidationError) as error:
            if strict:
                raise ConfigError(f"RAGLINE_AUTH__KEYS_FILE: cannot read {path}: {_problem(error)}") from None
            return  # keep the last good keys; a half-written file must not lock everyone out
        entries = [self._entry(k) for k in keys]
        if (twice := _listed_twice([*self._static, *entries])) is not None:
            # Which tenant the key is would depend on the order of the list: the last good keys
            # stay, and the operator is told.
            if strict:
                raise ConfigError(f"RAGLINE_AUTH__KEYS_FILE: {twice}")
            log.error("RAGLINE_AUTH__KEYS_FILE: %s; the keys before this change stay in force", twice)
            self._refused_text = text  # said once, not on every request while the file stays
            return
        with self._lock:
            self._file_keys = entries
            self._file_text = text

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
        for entry in entries:
            if hmac.compare_digest(entry.digest, digest):
                match = entry
        if match is None:
            raise RaglineError("the API key is not valid", code=ErrorCode.AUTH_ERROR)
        if match.revoked:
            raise RaglineError("the API key was revoked", code=ErrorCode.AUTH_ERROR)
        if match.expires_at is not None and datetime.now(UTC) >= match.expires_at:
            raise RaglineError("the API key has expired", code=ErrorCode.AUTH_ERROR)
        return match.principal


def require(principal: Principal, role: Role) -> None:
    """FORBIDDEN below `role`; the details name the scope that grants it, which the REST front
    sends back as an `insufficient_scope` challenge (RFC 6750 section 3.1), so an OAuth client
    knows which token to ask for."""
    if principal.role < role:
        raise RaglineError(
            f"this needs the {role.name.lower()} role",
            code=ErrorCode.FORBIDDEN,
            details={"required_scope": f"ragline:{role.name.lower()}"},
        )


def key_from_headers(authorization: str | None, x_api_key: str | None) -> str | None:
    if x_api_key:
        return x_api_key.strip()
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None

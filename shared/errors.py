"""The one error vocabulary of Ragline, shared by REST, MCP, the CLI and the workers.

Every failure a user can see carries a stable `ErrorCode`. REST maps it to an HTTP status,
MCP to `isError` with `CODE: message`, and workers record it on the document.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Stable, documented error codes (see README, "Error codes")."""

    AUTH_ERROR = "AUTH_ERROR"
    FORBIDDEN = "FORBIDDEN"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    UNSUPPORTED_MEDIA_TYPE = "UNSUPPORTED_MEDIA_TYPE"
    TOO_LARGE = "TOO_LARGE"
    RATE_LIMITED = "RATE_LIMITED"
    UNAVAILABLE = "UNAVAILABLE"
    PARSE_ERROR = "PARSE_ERROR"
    EMPTY_DOCUMENT = "EMPTY_DOCUMENT"
    PII_BLOCKED = "PII_BLOCKED"
    FETCH_REFUSED = "FETCH_REFUSED"
    FETCH_FAILED = "FETCH_FAILED"
    TIMEOUT = "TIMEOUT"
    REQUEST_TIMEOUT = "REQUEST_TIMEOUT"
    RETRIES_EXHAUSTED = "RETRIES_EXHAUSTED"
    INTERNAL = "INTERNAL"


HTTP_STATUS: dict[ErrorCode, int] = {
    ErrorCode.AUTH_ERROR: 401,
    ErrorCode.FORBIDDEN: 403,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.CONFLICT: 409,
    ErrorCode.INVALID_ARGUMENT: 422,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.PARSE_ERROR: 422,
    ErrorCode.EMPTY_DOCUMENT: 422,
    ErrorCode.PII_BLOCKED: 422,
    ErrorCode.FETCH_REFUSED: 422,
    ErrorCode.FETCH_FAILED: 502,
    ErrorCode.TIMEOUT: 504,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.RETRIES_EXHAUSTED: 500,
    ErrorCode.INTERNAL: 500,
}


class RaglineError(Exception):
    """A failure with a stable code, a message safe to show a user, and optional details."""

    code: ErrorCode = ErrorCode.INTERNAL
    retryable: bool = False

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.details = details or {}

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.code]

    def as_dict(self) -> dict[str, Any]:
        """The REST error envelope."""
        return {"code": self.code.value, "message": self.message, "details": self.details}

    def __str__(self) -> str:
        return f"{self.code.value}: {self.message}"


class TransientError(RaglineError):
    """A failure worth retrying: a dependency was unavailable or overloaded."""

    code = ErrorCode.UNAVAILABLE
    retryable = True


class OutageError(TransientError):
    """A backing service (OpenSearch, Redis) is down or overloaded: wait it out, however long.

    Unlike other transient failures it never uses up a document's retries: nothing is wrong with
    the document, and failing it would turn an operator's restart into lost work.
    """


class PermanentError(RaglineError):
    """A failure that retrying cannot fix: the input is bad. Fails the document at once."""

    code = ErrorCode.INVALID_ARGUMENT

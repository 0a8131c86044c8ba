"""Log lines of the services: one JSON object per event (or plain text), carrying who and what it was for.

The fields known where a line is written (tenant, kb, doc_id, stage, request_id) come from a
context variable: the worker binds them per task, the API per request. The variable holds one
mutable dict per scope, so a field set later in the same scope (the tenant, once the API key is
checked in a dependency running on a worker thread) still reaches every later line of that scope.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import parse_qs, unquote, urlsplit

import anyio

from shared.config import Settings

FIELDS = ("request_id", "tenant", "kb", "doc_id", "stage")
REDACTED = "[redacted]"
# Credentials that may reach a message by accident (an echoed header, a URL with a password).
_CREDENTIAL = re.compile(
    r"(?i)(bearer\s+|x-api-key[\"':=\s]+)[^\s\"',]+"  # a header's value
    r"|(://[^/\s:@]*:)[^\s/@]+(?=@)"  # the password of user:password@ (or :password@, Redis's) in a URL
)

_context: ContextVar[dict[str, str] | None] = ContextVar("ragline_log_context", default=None)


def current() -> dict[str, str]:
    """The fields bound in this scope (a copy)."""
    return dict(_context.get() or {})


@contextlib.contextmanager
def bound(**fields: str | None) -> Iterator[dict[str, str]]:
    """A new scope with these fields on top of the enclosing ones; yields its dict for later fields."""
    scope = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(scope)
    try:
        yield scope
    finally:
        _context.reset(token)


def add(**fields: str | None) -> None:
    """Set fields in the current scope (no-op outside one: nothing to attach them to)."""
    scope = _context.get()
    if scope is not None:
        scope.update({k: v for k, v in fields.items() if v is not None})


class Redactor:
    """Replaces known secrets and credential-looking values in a rendered line."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        # Longest first, so a secret containing another is replaced whole.
        self.secrets = sorted({s for s in secrets if len(s) >= 8}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return _CREDENTIAL.sub(lambda m: (m.group(1) or m.group(2)) + REDACTED, text)


class ContextFilter(logging.Filter):
    """Puts the bound fields on every record, so any formatter can use them."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = _context.get() or {}
        for name in FIELDS:
            if not hasattr(record, name) and name in scope:
                setattr(record, name, scope[name])
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, the context fields, and exc when raised."""

    def __init__(self, service: str, redact: Redactor) -> None:
        super().__init__()
        self.service = service
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return self.redact(json.dumps(line, ensure_ascii=False, default=str))


class TextFormatter(logging.Formatter):
    """Plain text for people: time, level, logger, message, then the context fields as k=v."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = " ".join(f"{n}={getattr(record, n)}" for n in FIELDS if getattr(record, n, None))
        return self.redact(f"{text} [{fields}]" if fields else text)


class ExpectedNoise(logging.Filter):
    """Drops what dependencies log as trouble when nothing is wrong, so the log holds events:
    - the MCP SDK's "Error in standalone SSE writer" traceback when a client ends its session
      (its stream is closed under the writer: `ClosedResourceError`), at every SDK client's exit;
    - Presidio's warning for each recognizer of a language Ragline does not load, at every
      worker start, and for each spaCy entity of a kind it has no name for (a number, a product),
      hundreds a document."""

    _CLOSED = (anyio.ClosedResourceError, anyio.BrokenResourceError)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "mcp.server.streamable_http" and record.msg == "Error in standalone SSE writer":
            error = record.exc_info[1] if record.exc_info else None
            return not isinstance(error, self._CLOSED)
        if record.name == "presidio-analyzer":
            message = str(record.msg)
            skipped = message.startswith("Recognizer not added to registry because language")
            unmapped = message.startswith("Entity ") and "is not mapped to a Presidio entity" in message
            return not (skipped or unmapped)
        return True


def secret_values(settings: Settings) -> list[str]:
    """The configured secrets, so a line that happens to contain one shows it redacted."""
    values = [key.key.get_secret_value() for key in settings.auth.api_keys]
    for secret in (settings.opensearch.password, settings.pii.hash_secret):
        if secret is not None:
            values.append(secret.get_secret_value())
    with contextlib.suppress(ValueError):  # Redis's password, as redis-py decodes it from the URL
        url = urlsplit(settings.redis.url)
        values += filter(None, [unquote(url.password or ""), *parse_qs(url.query).get("password", [])])
    keys_file = settings.auth.keys_file
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        if keys_file is not None:
            values += [str(entry["key"]) for entry in json.loads(keys_file.read_text())]
    return values


def configure(
    service: str, level: str | int, fmt: Literal["json", "text"], secrets: Iterable[str] = ()
) -> logging.Handler:
    """Route every logger (Ragline's, Celery's, uvicorn's) through one stderr handler in this format."""
    redact = Redactor(secrets)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service, redact) if fmt == "json" else TextFormatter(redact))
    handler.addFilter(ContextFilter())
    handler.addFilter(ExpectedNoise())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    # The OpenSearch client logs every request, and every 404 of a lookup as a warning: those are
    # not events. A failed request raises, and Ragline logs what it means where it is handled.
    logging.getLogger("opensearch").setLevel(max(root.level, logging.ERROR))
    # The MCP SDK logs every request it receives ("Processing request of type ..."): a stdio
    # client's stderr, and the API's log, would hold a line per call and nothing more.
    logging.getLogger("mcp.server.lowlevel.server").setLevel(max(root.level, logging.WARNING))
    # Presidio logs a line for each recognizer it loads, about 40 at each worker start.
    logging.getLogger("presidio-analyzer").setLevel(max(root.level, logging.WARNING))
    return handler

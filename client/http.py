"""The CLI's REST client: the same API a remote deployment serves."""

from __future__ import annotations

import json
import os
import random
import re
import sys
import time
from typing import Any
from urllib.parse import quote, unquote

import httpx

from shared.config import Settings
from shared.models import ID_PATTERN

RETRYABLE = {502, 503, 504}
DEV_KEY_NAME = "local development"  # the name deploy/local/api.sh gives the key it creates
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def _message(body: dict[str, Any]) -> str:
    """An error's message, with what each invalid field was refused for (the API's 422 details)."""
    message = str(body.get("message", ""))
    errors = body.get("details", {}).get("errors") if isinstance(body.get("details"), dict) else None
    if isinstance(errors, list) and errors:
        problems = [f"{e.get('field', '')}: {e.get('problem', '')}" for e in errors if isinstance(e, dict)]
        message += " (" + "; ".join(problems) + ")"
    return message


def local_server(settings: Settings) -> str:
    """The URL of the local stack's API (`make up`)."""
    return f"http://127.0.0.1:{settings.api.port}"


def default_server(settings: Settings) -> str:
    return os.environ.get("RAGLINE_SERVER") or local_server(settings)


def is_local_stack(server: str, settings: Settings) -> bool:
    """Whether `server` is the local stack's API: plain HTTP on loopback, at its port."""
    try:
        url = httpx.URL(server)
    except httpx.InvalidURL:
        return False
    return url.scheme == "http" and url.host in LOCAL_HOSTS and url.port == settings.api.port


def dev_key(settings: Settings) -> str | None:
    """The development key `make up` wrote to the state dir, found by its name."""
    try:
        entries = json.loads((settings.state_dir / "api-keys.json").read_text())
    except (OSError, ValueError):
        return None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == DEV_KEY_NAME and not entry.get("revoked"):
            key = entry.get("key")
            return key if isinstance(key, str) else None
    return None


def default_key(settings: Settings, server: str | None = None, explicit: str | None = None) -> str | None:
    """--api-key, else RAGLINE_API_KEY, else the local development key, for the local stack only.

    The development key is an admin key of the local tenant: sent to any other server it would
    hand that server a key to the local stack.
    """
    if explicit:
        return explicit
    if os.environ.get("RAGLINE_API_KEY"):
        return os.environ["RAGLINE_API_KEY"]
    return dev_key(settings) if is_local_stack(server or default_server(settings), settings) else None


def api_path(*segments: str) -> str:
    """`/v1/` and the segments, each percent-encoded whole, so an id stays one segment.

    A `/`, `?`, `#`, `%` or space in an id is encoded; a segment of only dots ("." or "..") too,
    which a URL would otherwise resolve away (`doc delete --kb K 'x/../..'` deleted the KB K).
    """
    encoded = [quote(segment, safe="") for segment in segments]
    return "/v1/" + "/".join(e.replace(".", "%2E") if e.strip(".") == "" else e for e in encoded)


def check_kb_path(path: str) -> None:
    """INVALID_ARGUMENT, before anything is sent, for a /v1/kbs/ path whose KB segment is no KB id.

    A `/` in a KB id is encoded, and the server decodes it before routing: `kb delete 'k/documents/x'`
    would delete document x of k. The server refuses such paths too (services/api/kb_path.py).
    """
    prefix = "/v1/kbs/"
    if not path.startswith(prefix) or path == prefix:
        return
    kb_id = unquote(path[len(prefix) :].split("?", 1)[0].split("/", 1)[0])
    if not re.fullmatch(ID_PATTERN, kb_id):
        raise ApiError(0, "INVALID_ARGUMENT", f"a knowledge base id must match {ID_PATTERN}, got {kb_id!r}")


class Remote:
    """Calls the API; raises ApiError with the server's code; waits out 429s and brief outages.

    A daily command (`patient=False`) tries twice and fails within seconds when nothing answers;
    a bulk load (`patient=True`) rides out a restart of the API, saying so on stderr each time.
    """

    def __init__(
        self,
        server: str,
        api_key: str | None,
        timeout_s: float = 120,
        *,
        patient: bool = False,
        unreachable_hint: str = "",
    ) -> None:
        headers = {"X-Api-Key": api_key} if api_key else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout_s)
        self.throttled = 0
        self.sends_key = api_key is not None
        self.auth_hint = ""  # what an AUTH_ERROR adds: where the key came from, or where none was
        self.attempts = 8 if patient else 2
        self.patient = patient
        self.unreachable_hint = unreachable_hint

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, attempts: int | None = None, **kwargs: Any) -> Any:
        """One call; transient failures retry (`attempts` in all), 429s wait as told (up to an hour)."""
        check_kb_path(path)
        attempts = attempts or self.attempts
        failures = 0
        throttle_deadline = time.monotonic() + 3600
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                failures += 1
                reason = f"cannot reach the Ragline API at {self.http.base_url} ({type(error).__name__})"
                if failures >= attempts:
                    raise ApiError(0, "UNAVAILABLE", reason + self.unreachable_hint) from None
                pause = min(30.0, 0.5 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
                if self.patient:
                    print(f"{reason}; retry {failures} of {attempts - 1} in {pause:.1f} s", file=sys.stderr)
                time.sleep(pause)
                continue
            if response.status_code == 429 and time.monotonic() < throttle_deadline:
                # Backpressure: wait as told and try again; accepted work is never dropped.
                self.throttled += 1
                time.sleep(float(response.headers.get("retry-after", "5")) * random.uniform(1.0, 1.5))  # noqa: S311
                continue
            if response.status_code in RETRYABLE and failures < attempts - 1:
                failures += 1
                time.sleep(min(30.0, 0.5 * 2**failures))
                continue
            if response.status_code >= 400:
                try:
                    body = response.json()
                    raise ApiError(response.status_code, body.get("code", "ERROR"), _message(body))
                except ValueError:
                    raise ApiError(response.status_code, "ERROR", response.text[:200]) from None
            return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

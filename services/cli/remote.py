"""The CLI's REST client: the same API a remote deployment serves."""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx

from shared.config import Settings

RETRYABLE = {502, 503, 504}


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message


def default_server(settings: Settings) -> str:
    return os.environ.get("RAGLINE_SERVER") or f"http://127.0.0.1:{settings.api.port}"


def default_key(settings: Settings) -> str | None:
    """RAGLINE_API_KEY, else the local development key `make up` created."""
    if os.environ.get("RAGLINE_API_KEY"):
        return os.environ["RAGLINE_API_KEY"]
    keys = Path(settings.state_dir) / "api-keys.json"
    if keys.is_file():
        entries = json.loads(keys.read_text())
        if entries:
            return str(entries[0]["key"])
    return None


class Remote:
    """Calls the API; raises ApiError with the server's code; waits out 429s and brief outages."""

    def __init__(self, server: str, api_key: str | None, timeout_s: float = 120) -> None:
        headers = {"X-Api-Key": api_key} if api_key else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout_s)
        self.throttled = 0

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, attempts: int = 8, **kwargs: Any) -> Any:
        """One call; transient failures retry `attempts` times, 429s wait as told (up to an hour)."""
        failures = 0
        throttle_deadline = time.monotonic() + 3600
        while True:
            try:
                response = self.http.request(method, path, **kwargs)
            except httpx.TransportError as error:
                failures += 1
                if failures >= attempts:
                    reason = f"cannot reach {self.http.base_url} ({type(error).__name__})"
                    raise ApiError(0, "UNAVAILABLE", reason) from None
                time.sleep(min(30.0, 0.5 * 2**failures) * random.uniform(0.5, 1.0))  # noqa: S311
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
                    raise ApiError(response.status_code, body.get("code", "ERROR"), body.get("message", ""))
                except ValueError:
                    raise ApiError(response.status_code, "ERROR", response.text[:200]) from None
            return response.json() if response.content else None

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.request("DELETE", path, **kwargs)

"""The error envelope both fronts answer with: `{code, message, details}` and the code's HTTP status."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from shared.errors import HTTP_STATUS, ErrorCode


def envelope(
    code: ErrorCode,
    message: str,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        status_code=HTTP_STATUS[code],
        content={"code": code.value, "message": message, "details": details or {}},
        headers=headers,
    )

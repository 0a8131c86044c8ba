"""The REST front's exception handlers: every failure answers with the shared error envelope."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kombu.exceptions import OperationalError as BrokerError
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import TransportError
from redis.exceptions import RedisError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from services.core.envelope import envelope
from shared.errors import ErrorCode, RaglineError

log = logging.getLogger(__name__)

_HTTP_CODES = {
    400: ErrorCode.INVALID_ARGUMENT,
    401: ErrorCode.AUTH_ERROR,
    403: ErrorCode.FORBIDDEN,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.INVALID_ARGUMENT,
    409: ErrorCode.CONFLICT,
    413: ErrorCode.TOO_LARGE,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.INVALID_ARGUMENT,
    429: ErrorCode.RATE_LIMITED,
}


def _validation_details(error: RequestValidationError) -> dict[str, Any]:
    problems = []
    for item in error.errors():
        # Never echo the input back: it may be a document's content or a secret.
        problems.append(
            {"field": ".".join(str(p) for p in item.get("loc", ())), "problem": item.get("msg", "")}
        )
    return {"errors": problems[:20]}


def install(app: FastAPI) -> None:
    @app.exception_handler(RaglineError)
    async def _domain(_: Request, error: RaglineError) -> JSONResponse:
        headers: dict[str, str] = {}
        if "retry_after" in error.details:
            headers["Retry-After"] = str(error.details["retry_after"])
        if error.code == ErrorCode.FORBIDDEN and "required_scope" in error.details:
            scope = error.details["required_scope"]
            challenge = f'realm="ragline", error="insufficient_scope", scope="{scope}"'
            headers["WWW-Authenticate"] = f"Bearer {challenge}"
        return envelope(error.code, error.message, error.details, headers or None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> JSONResponse:
        return envelope(ErrorCode.INVALID_ARGUMENT, "the request is not valid", _validation_details(error))

    @app.exception_handler(HTTPException)
    async def _http(_: Request, error: HTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(error.status_code, ErrorCode.INVALID_ARGUMENT)
        response = envelope(
            code, str(error.detail) if error.detail else code.value, headers=dict(error.headers or {})
        )
        if error.status_code == 405:
            response.status_code = 405  # a method the path does not take: 405 with its Allow header
        return response

    @app.exception_handler(OpenSearchConnectionError)
    @app.exception_handler(RedisError)
    @app.exception_handler(BrokerError)  # the broker is down, or its connection pool stayed full
    async def _down(_: Request, error: Exception) -> JSONResponse:
        log.warning("dependency unavailable: %s", type(error).__name__)
        return envelope(ErrorCode.UNAVAILABLE, "a backing service is unavailable; retry shortly")

    @app.exception_handler(TransportError)
    async def _transport(_: Request, error: TransportError) -> JSONResponse:
        status = error.status_code if isinstance(error.status_code, int) else 503
        if status == 429 or status >= 500:
            return envelope(ErrorCode.UNAVAILABLE, "the search cluster is busy or unavailable; retry shortly")
        log.error("OpenSearch rejected a request: %s", error.error)
        return envelope(ErrorCode.INVALID_ARGUMENT, "the request could not be executed")

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, error: ClientDisconnect) -> JSONResponse:
        # The client left while its body was read (a dropped upload): no one reads this answer,
        # and it is no error of the server's.
        log.info("the client left before its request's body was read")
        return envelope(ErrorCode.INVALID_ARGUMENT, "the request's body ended early")

    @app.exception_handler(Exception)
    async def _bug(_: Request, error: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return envelope(ErrorCode.INTERNAL, "internal error")

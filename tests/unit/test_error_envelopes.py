"""Error envelopes never carry a stack trace, an exception's text or the submitted content."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from services.api import errors
from services.mcp.results import error_result

CANARY = "canary-8c1f-private-content"


class Body(BaseModel):
    content: str = Field(max_length=10)
    count: int


def _app() -> FastAPI:
    app = FastAPI()
    errors.install(app)

    @app.post("/bug")
    def bug() -> None:
        raise RuntimeError(f"failed while handling {CANARY}")

    @app.post("/validated")
    def validated(body: Body) -> None:
        return None

    return app


def test_an_unhandled_error_is_a_bare_internal_envelope() -> None:
    with TestClient(_app(), raise_server_exceptions=False) as client:
        response = client.post("/bug")
    assert response.status_code == 500
    assert response.json() == {"code": "INTERNAL", "message": "internal error", "details": {}}


def test_a_validation_error_names_fields_but_not_their_values() -> None:
    with TestClient(_app()) as client:
        response = client.post("/validated", json={"content": CANARY * 3, "count": CANARY})
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "INVALID_ARGUMENT"
    assert {e["field"] for e in body["details"]["errors"]} == {"body.content", "body.count"}
    assert CANARY not in response.text


def test_an_mcp_tool_bug_is_internal_without_its_text() -> None:
    result = error_result(RuntimeError(f"failed while handling {CANARY}"))
    assert result.isError
    assert [block.text for block in result.content if block.type == "text"] == ["INTERNAL: internal error"]

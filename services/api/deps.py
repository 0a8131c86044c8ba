"""FastAPI dependencies: the app state and the caller's identity."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from services.api.auth import Principal, Role, key_from_headers, require
from services.api.state import AppState
from shared import logs


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.ragline
    return state


def caller(
    request: Request,
    authorization: Annotated[str | None, Header(description="`Bearer <API key>`")] = None,
    x_api_key: Annotated[str | None, Header(description="The API key (alternative to Authorization)")] = None,
) -> Principal:
    keys = app_state(request).keys
    assert keys is not None, "the HTTP app is always built with a key ring"
    principal = keys.principal(key_from_headers(authorization, x_api_key))
    params = request.path_params
    logs.add(tenant=principal.tenant, kb=params.get("kb_id"), doc_id=params.get("doc_id"))
    return principal


def reader(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.READ)
    return principal


def writer(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.WRITE)
    return principal


def admin(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.ADMIN)
    return principal


State = Annotated[AppState, Depends(app_state)]
Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]

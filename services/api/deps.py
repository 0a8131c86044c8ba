"""FastAPI dependencies: the app state and the caller's identity.

Async, though they do not wait on anything: FastAPI runs a sync dependency on the shared thread
pool, one hop there and back for each, for every request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from services.api.auth_gate import resolved
from services.core.auth import Principal, Role, require
from services.core.container import AppState
from services.core.identity import Authenticator
from shared import logs


async def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.ragline
    return state


async def caller(
    request: Request,
    authorization: Annotated[
        str | None, Header(description="`Bearer <API key or OAuth access token>`")
    ] = None,
    x_api_key: Annotated[str | None, Header(description="The API key (alternative to Authorization)")] = None,
) -> Principal:
    """The principal services/api/auth_gate.py resolved before the body was read; a route outside
    the gate's paths resolves its caller here, by the same authenticator."""
    principal = resolved(request.scope)
    if principal is None:
        auth: Authenticator | None = request.app.state.ragline.auth
        assert auth is not None, "the HTTP app is always built with an authenticator"
        principal = await auth.principal(request.headers)
    params = request.path_params
    logs.add(tenant=principal.tenant, kb=params.get("kb_id"), doc_id=params.get("doc_id"))
    return principal


async def reader(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.READ)
    return principal


async def writer(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.WRITE)
    return principal


async def admin(principal: Annotated[Principal, Depends(caller)]) -> Principal:
    require(principal, Role.ADMIN)
    return principal


State = Annotated[AppState, Depends(app_state)]
Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]

"""Knowledge bases: create, list, read, change, delete."""

from __future__ import annotations

from fastapi import APIRouter, Response
from pydantic import BaseModel, Field

from services.api.deps import Admin, Reader, State, Writer
from shared.catalog import KbChanges, KbView
from shared.models import ID_PATTERN, KbSettings

router = APIRouter(prefix="/v1/kbs", tags=["knowledge bases"])


class KbCreate(BaseModel):
    model_config = {"extra": "forbid"}
    kb_id: str = Field(
        pattern=ID_PATTERN, description="Chosen by the client, URL-safe, unique in the tenant."
    )
    name: str = Field(min_length=1, max_length=200)
    description: str = Field("", max_length=4000)
    tags: list[str] = Field(default_factory=list, max_length=50)
    settings: KbSettings = Field(default_factory=KbSettings)
    embedding_model: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="Embedding model of its chunks (default: the server's; `all-MiniLM-L6-v2-int8` is "
        "the faster int8 variant). Changed later only by a reembed.",
    )


class ReembedRequest(BaseModel):
    model_config = {"extra": "forbid"}
    model: str = Field(
        min_length=1, max_length=500, description="Embedding model to move the KB's chunks to."
    )


class KbList(BaseModel):
    knowledge_bases: list[KbView]


@router.post("", status_code=201, response_model=KbView)
def create_kb(body: KbCreate, state: State, who: Writer) -> KbView:
    return state.catalog.create_kb(
        who.tenant, body.kb_id, body.name, body.description, body.tags, body.settings, body.embedding_model
    )


@router.get("", response_model=KbList)
def list_kbs(state: State, who: Reader) -> KbList:
    return KbList(knowledge_bases=state.catalog.list_kbs(who.tenant))


@router.get("/{kb_id}", response_model=KbView)
def get_kb(kb_id: str, state: State, who: Reader) -> KbView:
    return state.catalog.get_kb(who.tenant, kb_id)


@router.patch("/{kb_id}", response_model=KbView)
def update_kb(kb_id: str, body: KbChanges, state: State, who: Writer) -> KbView:
    return state.catalog.update_kb(who.tenant, kb_id, body)


@router.delete("/{kb_id}", status_code=204)
def delete_kb(kb_id: str, state: State, who: Admin) -> Response:
    state.catalog.delete_kb(who.tenant, kb_id)
    return Response(status_code=204)


@router.post("/{kb_id}/reembed", status_code=202, response_model=KbView)
def reembed_kb(kb_id: str, body: ReembedRequest, state: State, who: Admin) -> KbView:
    """Re-embed the KB's chunks with another model, searches answering throughout; poll the KB
    until `reembed` is null (then `embedding_model` is the new model, or `reembed_error` says why not)."""
    return state.catalog.start_reembed(who.tenant, kb_id, body.model)

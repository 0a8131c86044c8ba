"""Tool parity with REST: every MCP tool is a REST operation an agent could call instead, with the
same arguments (the REST request's path, query and body fields, from the same request models),
and every REST operation is a tool or is named below as not one, with the reason.

A new route, a new field of a request model or a new tool argument fails here until both fronts
take it, or the difference is written down.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import BaseModel

from services.api.app import create_app
from services.api.upload_body import InlineDocument
from services.mcp import source_tools, tools
from shared.config import Settings
from shared.search.requests import SearchRequest

# tool -> (method, REST path)
COUNTERPARTS: dict[str, tuple[str, str]] = {
    "list_knowledge_bases": ("GET", "/v1/kbs"),
    "create_knowledge_base": ("POST", "/v1/kbs"),
    "search": ("POST", "/v1/search"),
    "get_document_status": ("GET", "/v1/kbs/{kb_id}/documents/{doc_id:path}"),
    "ingest": ("POST", "/v1/kbs/{kb_id}/documents"),
    "delete_document": ("DELETE", "/v1/kbs/{kb_id}/documents/{doc_id:path}"),
    "list_documents": ("GET", "/v1/kbs/{kb_id}/documents"),
    "get_batch_status": ("GET", "/v1/batches/{batch_id}"),
    "read_document": ("GET", "/v1/kbs/{kb_id}/chunks"),
    "list_sources": ("GET", "/v1/kbs/{kb_id}/sources"),
    "add_source": ("POST", "/v1/kbs/{kb_id}/sources"),
    "sync_source": ("POST", "/v1/kbs/{kb_id}/sources/{source_id}/sync"),
    "update_source": ("PATCH", "/v1/kbs/{kb_id}/sources/{source_id}"),
    "remove_source": ("DELETE", "/v1/kbs/{kb_id}/sources/{source_id}"),
}

# What one front takes that the other does not, and why.
ONLY_MCP: dict[str, set[str]] = {
    # Bytes travel as base64 in JSON-RPC; REST sends them as multipart files instead.
    "ingest": {"content_base64", "wait_seconds"},
    # Agents wait in the call and get progress; REST clients poll the run or the document.
    "sync_source": {"wait_seconds"},
    # The REST body is the source itself, or its change; the tool names it as one argument.
    "add_source": {"source"},
    "update_source": {"change"},
}
ONLY_REST: dict[str, set[str]] = {
    # Choosing a KB's embedding model is an operator's task, as moving it is (reembed, below).
    "create_knowledge_base": {"embedding_model"},
    # An upload's batch and queue wish belong to bulk clients; a tool call is one interactive document.
    "ingest": {"batch_id", "priority"},
    # The source's fields are the body: MCP `add_source` takes them as `source`.
    "add_source": {"type", "settings", "source_id", "name", "schedule", "doc_id_prefix", "max_deleted_share"},
    # The change's fields are the body: MCP `update_source` takes them as `change`.
    "update_source": {"name", "schedule", "max_deleted_share"},
}

# REST operations that are not tools, and why an agent does without them.
NOT_TOOLS: dict[tuple[str, str], str] = {
    ("GET", "/v1/kbs/{kb_id}"): "list_knowledge_bases answers each KB with its counts",
    ("PATCH", "/v1/kbs/{kb_id}"): "changing a KB's settings is an operator's task",
    ("DELETE", "/v1/kbs/{kb_id}"): "deleting a whole KB is an admin's task, not an agent's",
    ("POST", "/v1/kbs/{kb_id}/reembed"): "moving a KB to another model is an operator's task",
    ("POST", "/v1/kbs/{kb_id}/documents/{doc_id:path}/reingest"): "ingest of the same document is it",
    ("GET", "/v1/kbs/{kb_id}/sources/{source_id}"): "list_sources answers each source with its runs",
    ("GET", "/v1/kbs/{kb_id}/sources/{source_id}/runs"): "a run's history is an operator's view",
    ("GET", "/v1/kbs/{kb_id}/sources/{source_id}/runs/{run_id}"): "sync_source waits for the run",
}


def _tools() -> dict[str, Any]:
    return {f.__name__: f for f, _ in (*tools.TOOLS, *source_tools.SOURCE_TOOLS)}


def _tool_arguments(name: str) -> set[str]:
    return set(inspect.signature(_tools()[name]).parameters) - {"ctx"}


def _routes() -> dict[tuple[str, str], APIRoute]:
    app = create_app(Settings(auth={"allow_anonymous": True}))
    found: dict[tuple[str, str], APIRoute] = {}
    for context in iter_route_contexts(app.router.routes):
        route = context.route
        if isinstance(route, APIRoute) and route.path.startswith("/v1/"):
            for method in (route.methods or set()) - {"HEAD"}:
                found[(method, route.path)] = route
    return found


def _fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def _rest_arguments(route: APIRoute) -> set[str]:
    dependant = route.dependant
    names = {p.name for p in dependant.path_params} | {p.name for p in dependant.query_params}
    for body in dependant.body_params:
        annotation = body.field_info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            names |= _fields(annotation)
        else:  # a union of models (a source's types): the fields any of them takes
            names |= {f for model in getattr(annotation, "__args__", ()) for f in _fields(model)}
    if route.path == "/v1/kbs/{kb_id}/documents" and route.methods == {"POST"}:
        names |= _fields(InlineDocument)  # read by the route itself (services/api/upload_body.py)
    return names


@pytest.fixture(scope="module")
def routes() -> dict[tuple[str, str], APIRoute]:
    return _routes()


def test_every_tool_has_a_rest_counterpart_and_every_route_is_a_tool_or_says_why_not(
    routes: dict[tuple[str, str], APIRoute],
) -> None:
    assert set(COUNTERPARTS) == set(_tools()), "a tool without a REST counterpart (or one gone)"
    mapped = set(COUNTERPARTS.values())
    assert mapped <= set(routes), mapped - set(routes)
    assert set(routes) - mapped == set(NOT_TOOLS), "a REST route that is neither a tool nor in NOT_TOOLS"


@pytest.mark.parametrize("tool", sorted(COUNTERPARTS))
def test_a_tool_takes_the_arguments_of_its_rest_request(
    tool: str, routes: dict[tuple[str, str], APIRoute]
) -> None:
    rest = _rest_arguments(routes[COUNTERPARTS[tool]])
    mcp = _tool_arguments(tool)
    assert mcp - rest == ONLY_MCP.get(tool, set()), f"{tool}: MCP-only arguments"
    assert rest - mcp == ONLY_REST.get(tool, set()), f"{tool}: REST-only fields"


def test_mcp_search_defaults_are_the_requests() -> None:
    parameters = inspect.signature(tools.search).parameters
    for name, field in SearchRequest.model_fields.items():
        if not field.is_required():
            assert parameters[name].default == field.default, name

"""MCP `search` takes the same fields as the REST search request: one model, two fronts."""

from __future__ import annotations

import inspect

from services.mcp import tools
from shared.search.requests import SearchRequest


def test_mcp_search_takes_every_field_of_the_rest_request() -> None:
    arguments = set(inspect.signature(tools.search).parameters) - {"ctx"}
    assert arguments == set(SearchRequest.model_fields)


def test_mcp_search_defaults_are_the_requests() -> None:
    parameters = inspect.signature(tools.search).parameters
    for name, field in SearchRequest.model_fields.items():
        if not field.is_required():
            assert parameters[name].default == field.default, name

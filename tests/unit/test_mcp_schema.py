"""The output schemas clients check every MCP result against: the same rules, in fewer steps."""

from __future__ import annotations

from typing import Any

from jsonschema import Draft7Validator

from services.mcp.server import nullable_types
from shared.search.hybrid import SearchResponse


def test_optional_fields_become_type_lists_and_nothing_else_changes() -> None:
    schema: dict[str, Any] = {
        "properties": {
            "page": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "Page"},
            "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
            "ref": {"anyOf": [{"$ref": "#/$defs/Arm"}, {"type": "null"}]},
            "bounded": {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]},
        },
        "$defs": {"Arm": {"properties": {"rank": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}}},
    }
    out = nullable_types(schema)
    assert out["properties"]["page"] == {"type": ["integer", "null"], "default": None, "title": "Page"}
    assert out["$defs"]["Arm"]["properties"]["rank"] == {"type": ["integer", "null"]}
    for kept in ("either", "ref", "bounded"):
        assert out["properties"][kept] == schema["properties"][kept]


def test_the_search_schema_accepts_and_refuses_what_it_did() -> None:
    before = SearchResponse.model_json_schema()
    after = nullable_types(before)
    assert "anyOf" not in str(after["$defs"]["Hit"]["properties"]["page_num"])
    hit = {"text": "t", "score": 1.0, "kb_id": "k", "doc_id": "d", "chunk_idx": 0, "page_num": None}
    cases = [
        {"results": [hit], "latency_ms": 1.0},
        {"results": [{**hit, "page_num": 3}], "latency_ms": 1.0},
        {"results": [{**hit, "page_num": "3"}], "latency_ms": 1.0},
        {"results": [{**hit, "title": 5}], "latency_ms": 1.0},
        {"results": [{**hit, "keyword": {"rank": None, "score": 2.5}}], "latency_ms": 1.0},
        {"results": [{**hit, "keyword": {"rank": "1"}}], "latency_ms": 1.0},
    ]
    for case in cases:
        assert Draft7Validator(after).is_valid(case) == Draft7Validator(before).is_valid(case), case
    assert [Draft7Validator(after).is_valid(c) for c in cases] == [True, True, False, False, True, False]

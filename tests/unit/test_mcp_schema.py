"""The output schemas clients check every MCP result against, and the results themselves: the
same rules and the same content, in fewer steps."""

from __future__ import annotations

import json
from typing import Any

from jsonschema import Draft7Validator

from services.mcp.output_schema import DIALECT, client_schema, inline_nested_refs, nullable_types, structured
from shared.models import KbSettings
from shared.search.requests import ArmResult, Hit, SearchResponse

HIT = {"text": "t", "score": 1.0, "kb_id": "k", "doc_id": "d", "chunk_idx": 0, "page_num": None}
# (result, valid) pairs: what any rewrite of the search schema must still accept and refuse.
CASES: list[tuple[dict[str, Any], bool]] = [
    ({"results": [HIT], "latency_ms": 1.0}, True),
    ({"results": [{**HIT, "page_num": 3}], "latency_ms": 1.0}, True),
    ({"results": [{**HIT, "page_num": "3"}], "latency_ms": 1.0}, False),
    ({"results": [{**HIT, "title": 5}], "latency_ms": 1.0}, False),
    ({"results": [{**HIT, "keyword": {"rank": None, "score": 2.5}}], "latency_ms": 1.0}, True),
    ({"results": [{**HIT, "keyword": {"rank": "1"}}], "latency_ms": 1.0}, False),
    ({"results": [{**HIT, "document_semantic": {"score": "high"}}], "latency_ms": 1.0}, False),
    ({"results": [{**HIT, "document_keyword": []}], "latency_ms": 1.0}, False),
    ({"results": [{k: v for k, v in HIT.items() if k != "doc_id"}], "latency_ms": 1.0}, False),
    ({"results": [HIT]}, False),
]


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


def test_the_search_schema_accepts_and_refuses_what_pydantics_did() -> None:
    before = SearchResponse.model_json_schema()
    after = client_schema(before)
    assert after["$schema"] == DIALECT
    assert "anyOf" not in str(after["$defs"]["Hit"]["properties"]["page_num"])
    for case, valid in CASES:
        assert Draft7Validator(before).is_valid(case) is valid, case
        assert Draft7Validator(after).is_valid(case) is valid, case


def test_a_search_result_is_checked_with_one_reference_a_hit() -> None:
    schema = client_schema(SearchResponse.model_json_schema())
    text = json.dumps(schema)
    # The top level refers to the hit's definition (its meta-schema check stays small); the
    # hit's four arm results are written out in it, not looked up once per hit each.
    assert text.count('"$ref"') == 1
    assert schema["properties"]["results"]["items"] == {"$ref": "#/$defs/Hit"}
    assert list(schema["$defs"]) == ["Hit"]
    arm = schema["$defs"]["Hit"]["properties"]["document_keyword"]
    assert arm["properties"]["rank"] == {"type": ["integer", "null"], "default": None, "title": "Rank"}
    assert arm["description"] == "Where the hit's document ranked in the document BM25 arm."


def test_a_definition_that_reaches_itself_keeps_its_reference() -> None:
    schema: dict[str, Any] = {
        "properties": {"root": {"$ref": "#/$defs/Node"}},
        "$defs": {
            "Node": {
                "properties": {
                    "children": {"items": {"$ref": "#/$defs/Node"}, "type": "array"},
                    "label": {"$ref": "#/$defs/Label"},
                }
            },
            "Label": {"type": "string", "maxLength": 3},
            "Unused": {"type": "integer"},
        },
    }
    out = inline_nested_refs(schema)
    node = out["$defs"]["Node"]["properties"]
    assert node["children"]["items"] == {"$ref": "#/$defs/Node"}
    assert node["label"] == {"type": "string", "maxLength": 3}
    assert sorted(out["$defs"]) == ["Node"]
    tree = {"root": {"label": "a", "children": [{"label": "b", "children": []}]}}
    assert Draft7Validator(out).is_valid(tree)
    assert not Draft7Validator(out).is_valid({"root": {"children": [{"label": "long"}]}})


def test_a_search_hit_leaves_out_its_empty_fields_and_loses_nothing() -> None:
    bare = Hit(text="t", score=0.5, kb_id="k", doc_id="d", chunk_idx=0, keyword=ArmResult(rank=1, score=2.0))
    full = Hit(
        text="t",
        score=0.0,
        kb_id="k",
        doc_id="d",
        chunk_idx=3,
        title="T",
        headings=["A", "B"],
        page_num=0,
        metadata={"year": 2020},
        highlights=["<em>t</em>"],
        semantic=ArmResult(rank=2, score=0.0),
    )
    response = SearchResponse(results=[bare, full], latency_ms=3.0)
    out = structured(response)
    assert set(out["results"][0]) == {"text", "score", "kb_id", "doc_id", "chunk_idx", "keyword"}
    # Falsy values that are not the default (a score of 0, page 0) stay.
    assert out["results"][1]["score"] == 0.0
    assert out["results"][1]["page_num"] == 0
    assert out["results"][1]["semantic"] == {"rank": 2, "score": 0.0}
    assert SearchResponse.model_validate(out) == response
    assert Draft7Validator(client_schema(SearchResponse.model_json_schema())).is_valid(out)


def test_other_results_keep_their_defaults() -> None:
    # A knowledge base's settings at their defaults still tell an agent its PII policy.
    assert structured(KbSettings()) == KbSettings().model_dump(mode="json")
    assert structured(KbSettings())["pii_policy"] == "redact"

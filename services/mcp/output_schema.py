"""What MCP clients check every tool result against, in the shape that is cheapest to check.

The official SDK client runs `jsonschema.validate(result, tool.outputSchema)` on every call: it
checks the schema against its dialect's meta-schema, then walks the result one property at a
time. Both costs are the client's, on every search; these rewrites keep each rule and cut the
steps the walk takes.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from shared.search.requests import SearchResponse

# The dialect our output schemas are written in. Left undeclared, a client validates with the
# latest draft, and the official SDK client then checks the schema itself against the 2020-12
# meta-schema on every result, which costs far more than checking the result. The schemas use only
# draft-07 keywords ($defs is reached by JSON pointer), and draft-07 is also what ajv, the
# TypeScript SDK's validator, assumes.
DIALECT = "http://json-schema.org/draft-07/schema#"
_DEFS = "#/$defs/"


def client_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic output schema as clients get it: its dialect declared, optional fields as type
    lists, definitions written out where they are used."""
    return {"$schema": DIALECT, **inline_nested_refs(nullable_types(schema))}


def nullable_types(schema: Any) -> Any:
    """`schema` with pydantic's `anyOf: [{type: T}, {type: null}]` written `type: [T, null]`.

    The same constraint, checked in one step: each `anyOf` branch is a subschema the client
    descends into, once per field of every result.
    """
    if isinstance(schema, list):
        return [nullable_types(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: nullable_types(value) for key, value in schema.items()}
    branches = out.get("anyOf")
    if (
        isinstance(branches, list)
        and len(branches) == 2
        and {"type": "null"} in branches
        and all(list(b) == ["type"] and isinstance(b["type"], str) for b in branches)
    ):
        (other,) = [b["type"] for b in branches if b["type"] != "null"]
        del out["anyOf"]
        out["type"] = [other, "null"]
    return out


def inline_nested_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every reference inside a definition replaced by the definition it names.

    The top level still refers to `$defs`, and that stays cheap: draft-07's meta-schema does not
    know `$defs`, so the client's check of the schema itself never walks them (written out in
    full at the top level, the schema check would walk every definition each time). Inside a
    definition each reference costs a lookup per result item: a search hit and its four arm
    results would be five lookups a hit. A definition that reaches itself keeps its reference.
    """
    defs: dict[str, Any] = schema.get("$defs", {})

    def written_out(node: Any, within: frozenset[str]) -> Any:
        if isinstance(node, list):
            return [written_out(item, within) for item in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        rest = {key: written_out(value, within) for key, value in node.items() if key != "$ref"}
        if isinstance(ref, str) and ref.startswith(_DEFS) and ref[len(_DEFS) :] not in within:
            name = ref[len(_DEFS) :]
            # A reference's siblings are the field's own annotations (its description): they
            # say more than the definition's title.
            return {**written_out(defs[name], within | {name}), **rest}
        return rest if ref is None else {"$ref": ref, **rest}

    top = {key: value for key, value in schema.items() if key != "$defs"}
    if not defs:
        return top
    new_defs = {name: written_out(body, frozenset({name})) for name, body in defs.items()}
    used = _references(top) | {n for body in new_defs.values() for n in _references(body)}
    return {**top, "$defs": {name: body for name, body in new_defs.items() if name in used}}


def _references(node: Any) -> set[str]:
    if isinstance(node, list):
        return {name for item in node for name in _references(item)}
    if not isinstance(node, dict):
        return set()
    found = {name for value in node.values() for name in _references(value)}
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_DEFS):
        found.add(ref[len(_DEFS) :])
    return found


def structured(result: BaseModel) -> dict[str, Any]:
    """A tool's result as the JSON clients get; a search's hits without their empty fields.

    In a hit a default means nothing there (no title or page, no highlights, an arm that did
    not rank it), the output schema gives it and does not require the field, so a client loses
    nothing: an agent reads fewer tokens, and the client's check has fewer properties to walk.
    Elsewhere a default is information: a knowledge base's default PII policy is still its policy.
    """
    return result.model_dump(mode="json", by_alias=True, exclude_defaults=isinstance(result, SearchResponse))

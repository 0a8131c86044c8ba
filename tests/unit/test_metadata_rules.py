"""The bound on caller metadata: each bound refused by name, never echoing a key or value."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.metadata_rules import MAX_KEYS, MAX_LIST_ITEMS, check_metadata
from shared.search.metadata import MAX_DEPTH, MAX_KEY_CHARS, MAX_TERMS

LIMIT = 64 << 10
SECRET = "secret-value-7f3a"


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": SECRET}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def _refused(metadata: object, limit: int = LIMIT) -> dict[str, Any]:
    with pytest.raises(RaglineError) as caught:
        check_metadata(metadata, limit)
    error = caught.value
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert SECRET not in str(error)
    assert SECRET not in repr(error.details)
    assert error.details["field"] == "metadata"
    return error.details


def test_metadata_within_the_bounds_is_kept_as_given() -> None:
    metadata = {
        "team": "docs",
        "year": 2024,
        "tags": ["a", "b"] * (MAX_LIST_ITEMS // 2),
        "nested": _nested(MAX_DEPTH - 1),
        "k" * MAX_KEY_CHARS: None,
        "ok": True,
        "ratio": 0.5,
    }
    assert check_metadata(metadata, LIMIT) is metadata
    assert check_metadata({}, LIMIT) == {}


def test_the_key_bound_matches_what_a_chunk_indexes() -> None:
    assert MAX_KEYS == MAX_TERMS
    assert check_metadata({f"k{i}": 1 for i in range(MAX_KEYS)}, LIMIT)


@pytest.mark.parametrize(
    ("metadata", "bound"),
    [
        ({"k": [0] * 31_000_000}, "list_items"),
        ({"k": [{} for _ in range(MAX_LIST_ITEMS + 1)]}, "list_items"),
        ({"k": [[0] * 1000 for _ in range(1000)]}, "bytes"),
        ({"k": SECRET * 10_000}, "bytes"),
        ({f"{SECRET}{i}": i for i in range(MAX_KEYS + 1)}, "keys"),
        ({"a": {f"k{i}": 1 for i in range(600)}, "b": {f"k{i}": 1 for i in range(600)}}, "keys"),
        (_nested(MAX_DEPTH + 1), "depth"),
        ({"k": [[[[[[[[[SECRET]]]]]]]]]}, "depth"),
        ({SECRET * 20: 1}, "key_chars"),
        ({1: SECRET}, "key_type"),
        ({"k": {SECRET}}, "value_type"),
        ({"k": float("nan")}, "value_type"),
        ({"k": [float("inf")]}, "value_type"),
        ({"k": {"n": -float("inf")}}, "value_type"),
        ({"k": "\ud800"}, "value_type"),
        ({"k\udfff": 1}, "value_type"),
        ([SECRET], "type"),
        (SECRET, "type"),
    ],
    ids=[
        "31M-zeros",
        "long-list-of-objects",
        "wide-list-of-lists",
        "long-string",
        "many-keys",
        "keys-counted-at-every-level",
        "deep-objects",
        "deep-lists",
        "long-key",
        "non-string-key",
        "a-set",
        "nan",
        "infinity",
        "minus-infinity",
        "lone-surrogate-value",
        "lone-surrogate-key",
        "a-list",
        "a-string",
    ],
)
def test_each_bound_is_refused_by_name(metadata: object, bound: str) -> None:
    assert _refused(metadata)["bound"] == bound


def test_the_size_is_the_setting() -> None:
    metadata = {"text": "x" * 2000}
    assert _refused(metadata, limit=1024)["limit"] == 1024
    assert check_metadata(metadata, 4096) is metadata


def test_a_huge_object_is_refused_at_the_first_bound_it_meets() -> None:
    # 21M empty objects (the audit's second payload): the walk stops at the list bound.
    assert _refused({"k": [{}] * 21_000_000})["bound"] == "list_items"

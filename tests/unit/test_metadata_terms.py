"""Caller metadata as typed keyword terms: orderings, what is indexed, and the filters built on them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import Any

import pytest
from pydantic import ValidationError

from shared.search.fusion import Fusion
from shared.search.metadata import (
    DATES,
    MAX_TERMS,
    NUMBERS,
    SEPARATOR,
    SOURCE,
    VALUES,
    encode_instant,
    encode_number,
    in_range,
    indexed_terms,
    one_of,
    parse_date,
    stored_metadata,
    with_metadata_fields,
)
from shared.search.queries import filter_clauses
from shared.search.requests import Filters, Range, SearchRequest
from shared.search.searcher import reported_scores


def _in(term_range: dict[str, Any], term: str) -> bool:
    """Whether a keyword `term` falls in a range query's bounds, compared as OpenSearch does (bytes)."""
    ((_, bounds),) = term_range["range"].items()
    encoded = term.encode()
    checks = {
        "gt": lambda b: encoded > b,
        "gte": lambda b: encoded >= b,
        "lt": lambda b: encoded < b,
        "lte": lambda b: encoded <= b,
    }
    return all(checks[op](bound.encode()) for op, bound in bounds.items())


def test_numbers_sort_as_their_values() -> None:
    values = [-1e308, -1e10, -2.5, -1, -1e-300, 0, 1e-300, 0.5, 1, 2, 2.5, 10, 1e10, 2**53, 1e308]
    encoded = [encode_number(v) for v in values]
    assert encoded == sorted(encoded)
    assert len(set(encoded)) == len(values)
    assert all(len(e) == 16 for e in encoded)
    assert encode_number(-0.0) == encode_number(0) == encode_number(0.0)
    assert encode_number(3) == encode_number(3.0)


def test_dates_with_offsets_sort_as_instants_in_utc() -> None:
    texts = [
        "0999-01-01",
        "2021-03-04T10:00:00+02:00",  # 08:00 UTC
        "2021-03-04T09:00:00Z",
        "2021-03-04 10:00",  # no offset: UTC
        "2021-03-04T05:30:01-05:00",  # 10:30:01 UTC
        "2021-03-05",
    ]
    instants = [parse_date(t) for t in texts]
    assert all(i is not None for i in instants)
    encoded = [encode_instant(i) for i in instants if i is not None]
    assert encoded == sorted(encoded)  # type: ignore[type-var]
    assert encoded[0] == "0999-01-01T00:00:00.000000Z"
    assert encoded[1] == "2021-03-04T08:00:00.000000Z"
    assert parse_date("next tuesday") is None
    assert parse_date("2021-02-30") is None
    assert parse_date("20210304") is None  # numbers are not dates


def test_what_is_indexed() -> None:
    terms = indexed_terms(
        {
            "team": "docs",
            "year": 2020,
            "ratio": -0.25,
            "draft": False,
            "when": "2021-03-04",
            "tags": ["a", "b", 3, None],
            "owner": {"name": "x", "address": {"city": "y"}},
            "rows": [{"id": 1}, {"id": 2}],
            "nothing": None,
            "huge": 10**400,
            "long": "v" * 5000,
            "bad\x1fkey": "z",
            "": "empty",
        }
    )
    s = SEPARATOR
    assert terms[VALUES] == [
        f"team{s}docs",
        f"draft{s}false",
        f"when{s}2021-03-04",
        f"tags{s}a",
        f"tags{s}b",
        f"owner.name{s}x",
        f"owner.address.city{s}y",
    ]
    assert terms[NUMBERS] == [
        f"year{s}{encode_number(2020)}",
        f"ratio{s}{encode_number(-0.25)}",
        f"tags{s}{encode_number(3)}",
        f"rows.id{s}{encode_number(1)}",
        f"rows.id{s}{encode_number(2)}",
    ]
    assert terms[DATES] == [f"when{s}2021-03-04T00:00:00.000000Z"]


def test_terms_are_bounded_a_chunk() -> None:
    terms = indexed_terms({f"k{i}": i for i in range(5000)})
    assert sum(len(t) for t in terms.values()) == MAX_TERMS


def test_source_keeps_metadata_verbatim_and_replaces_the_legacy_copy() -> None:
    given = {"when": "next tuesday", "deep": {"a": [1, {"b": None}]}}
    source = with_metadata_fields({"text": "t", "metadata": {"old": 1}}, given)
    assert "metadata" not in source
    assert source[SOURCE] == given
    assert stored_metadata(source) == given
    assert stored_metadata({"metadata": {"old": 1}}) == {"old": 1}
    assert json.loads(json.dumps(source)) == source


def test_equality_compares_each_value_by_its_type() -> None:
    s = SEPARATOR
    assert one_of("k", ["x"]) == {"terms": {VALUES: [f"k{s}x"]}}
    assert one_of("k", [True]) == {"terms": {VALUES: [f"k{s}true"]}}
    assert one_of("k", [2]) == {"terms": {NUMBERS: [f"k{s}{encode_number(2.0)}"]}}
    # A date string matches the string and the instant (the same day written with a time).
    dated = one_of("k", ["2021-03-04"])
    assert dated["bool"]["should"] == [
        {"terms": {VALUES: [f"k{s}2021-03-04"]}},
        {"terms": {DATES: [f"k{s}2021-03-04T00:00:00.000000Z"]}},
    ]


def test_numeric_ranges_are_exact_over_one_key() -> None:
    def term(key: str, value: float) -> str:
        return f"{key}{SEPARATOR}{encode_number(value)}"

    query = in_range("n", {"gte": -2.5, "lt": 10.0})
    assert [v for v in (-3, -2.5, 0, 9.99, 10, 11) if _in(query, term("n", v))] == [-2.5, 0, 9.99]
    open_above = in_range("n", {"gt": 0.0})
    assert not _in(open_above, term("n", 0))
    assert _in(open_above, term("n", 1e308))
    assert not _in(open_above, term("n2", 5))
    assert not _in(open_above, term("n b", 5))
    assert not _in(in_range("n", {"lt": 0.0}), term("m", -5))


def test_date_ranges_cover_whole_days_and_respect_offsets() -> None:
    def term(text: str) -> str:
        instant = parse_date(text)
        assert instant is not None
        return f"d{SEPARATOR}{encode_instant(instant)}"

    march = in_range("d", {"gte": date(2021, 3, 1), "lte": date(2021, 3, 31)})
    assert _in(march, term("2021-03-31T23:59:59Z"))
    assert not _in(march, term("2021-04-01"))
    assert not _in(march, term("2021-03-01T01:00:00+02:00"))  # Feb 28th, 23:00 UTC
    assert _in(march, term("2021-03-01"))
    after = in_range("d", {"gt": date(2021, 3, 4)})
    assert not _in(after, term("2021-03-04T12:00:00Z"))
    assert _in(after, term("2021-03-05"))
    instant = in_range("d", {"gte": datetime(2021, 3, 4, 10, tzinfo=UTC)})
    assert _in(instant, term("2021-03-04T12:00:00+02:00"))
    assert not _in(instant, term("2021-03-04T11:00:00+02:00"))
    assert not _in(in_range("d", {"lte": date(9999, 12, 31)}), f"e{SEPARATOR}0001")


@pytest.mark.parametrize(
    "bounds",
    [
        {"gte": 5, "lt": "2021-01-01"},  # a number and a date
        {"gte": "next tuesday"},
        {"gte": "2021-02-30"},
        {"gte": True},
        {"gte": "nan"},
        {"gte": 10**400},  # an integer no float holds: it raised OverflowError, a 500
        {"gt": 1, "gte": 2},
        {},
    ],
)
def test_invalid_ranges_are_refused_by_the_request_model(bounds: dict[str, Any]) -> None:
    body = {"query": "x", "filters": {"metadata": {"k": {"range": bounds}}}}
    with pytest.raises(ValidationError):
        SearchRequest.model_validate(body)
    with pytest.raises(ValidationError):
        SearchRequest.model_validate_json(json.dumps(body))


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "1" + "0" * 400])
@pytest.mark.parametrize(
    "shape",
    ['{{"k": {0}}}', '{{"k": ["a", {0}]}}', '{{"k": {{"eq": {0}}}}}', '{{"k": {{"in": [1, {0}]}}}}'],
)
def test_equality_on_a_number_no_float_holds_is_refused_like_a_range(number: str, shape: str) -> None:
    """It answered 200 with no hits, where the same number as a range bound was refused."""
    body = f'{{"query": "x", "filters": {{"metadata": {shape.format(number)}}}}}'
    with pytest.raises(ValidationError, match="finite number"):
        SearchRequest.model_validate_json(body)
    with pytest.raises(ValidationError, match="finite number"):
        SearchRequest.model_validate(json.loads(body))


def test_equality_on_finite_numbers_booleans_and_strings_is_accepted() -> None:
    metadata = {"a": 2, "b": [1.5, "NaN", True], "c": {"eq": 10**300}, "d": {"in": [0, -3e300]}}
    assert Filters.model_validate({"metadata": metadata}).metadata["a"] == 2


def test_a_plain_list_holds_no_more_values_than_in_does() -> None:
    """70,000 values reached OpenSearch, which refuses over 65,536 terms: a 503 for a caller's error."""
    with pytest.raises(ValidationError, match="at most 1000 values"):
        Filters.model_validate({"metadata": {"k": list(range(1001))}})
    with pytest.raises(ValidationError):
        Filters.model_validate({"metadata": {"k": {"in": list(range(1001))}}})
    assert len(Filters.model_validate({"metadata": {"k": list(range(1000))}}).metadata["k"]) == 1000  # type: ignore[arg-type]


def test_range_bounds_parse_the_same_from_json_and_python() -> None:
    for bounds in ({"gte": "2021-03-04"}, {"gte": "2021-03-04T00:00:00Z"}, {"gte": "20210304"}, {"lt": 7}):
        assert Range.model_validate(bounds).bounds() == Range.model_validate_json(json.dumps(bounds)).bounds()
    assert Range.model_validate({"gte": "2021-03-04T00:00:00Z"}).bounds()["gte"] == datetime(
        2021, 3, 4, tzinfo=UTC
    )
    assert Range.model_validate({"gte": "20210304"}).bounds()["gte"] == 20210304.0


def test_metadata_keys_with_control_characters_or_too_many_are_refused() -> None:
    with pytest.raises(ValidationError):
        Filters.model_validate({"metadata": {"a\x1fb": "c"}})
    with pytest.raises(ValidationError):
        Filters.model_validate({"metadata": {f"k{i}": i for i in range(2000)}})
    assert len(Filters.model_validate({"metadata": {f"k{i}": i for i in range(100)}}).metadata) == 100


def test_filter_clauses_use_the_typed_fields() -> None:
    filters = Filters.model_validate({"metadata": {"team": "docs", "year": {"range": {"gte": 2020}}}})
    clauses = filter_clauses("t", ["kb"], filters)
    assert clauses[:2] == [{"term": {"tenant_id": "t"}}, {"terms": {"kb_id": ["kb"]}}]
    assert clauses[2] == {"terms": {VALUES: [f"team{SEPARATOR}docs"]}}
    assert NUMBERS in clauses[3]["range"]


def test_reported_scores_depend_on_the_order_only() -> None:
    chosen = [("a", 0.91), ("b", 0.5), ("c", 0.5), ("d", 0.1)]
    assert reported_scores(chosen, Fusion.MIN_MAX) == [("a", 1.0), ("b", 0.5), ("c", 0.5), ("d", 1 / 3)]
    scaled = [(h, s * 7.3 + 1) for h, s in chosen]
    assert reported_scores(scaled, Fusion.Z_SCORE) == reported_scores(chosen, Fusion.MIN_MAX)
    assert reported_scores(chosen, Fusion.RRF) == chosen


@pytest.mark.parametrize("weight", ["NaN", "Infinity", "1e400"])
def test_a_weight_that_is_no_number_is_refused(weight: str) -> None:
    """Python's JSON reads NaN and infinities: a NaN weight made every fused score null."""
    with pytest.raises(ValidationError):
        SearchRequest.model_validate_json(f'{{"query": "x", "weights": {{"keyword": {weight}}}}}')
    with pytest.raises(ValidationError):
        SearchRequest.model_validate(json.loads(f'{{"query": "x", "weights": {{"keyword": {weight}}}}}'))

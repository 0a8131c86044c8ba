"""Caller metadata in the chunk index: kept verbatim, indexed as typed terms in three fixed fields.

A dynamic mapping typed each metadata key by the first value any tenant gave it, so one tenant's
`{"when": "2021-03-04"}` made another's `"next tuesday"` unstorable, and every new key was a new
field of an index that all tenants share (1,000 at most). Here the metadata is kept in `_source`
only (`caller_metadata`, not indexed) and its values become `key␟value` terms (␟ is U+001F) of
three keyword fields whose number never grows:

- `metadata_values`: strings, and booleans as `true` / `false`: equality and membership;
- `metadata_numbers`: finite numbers as 16 hex digits that sort as the numbers do;
- `metadata_dates`: strings that are ISO 8601 dates, as UTC `YYYY-MM-DDTHH:MM:SS.ffffffZ`, which
  sort as the instants do (a date-time without an offset is UTC).

A keyword range over one key's terms is then exact. What is indexed: scalars and lists of
scalars; nested objects flatten into dotted keys (`{"a": {"b": 1}}` is `a.b`, as the dynamic
mapping had it); `null` is not indexed. Keys with control characters or over `MAX_KEY_CHARS`, strings
over `MAX_VALUE_CHARS`, non-finite numbers, and terms past `MAX_TERMS` a chunk stay in `_source`
only. A string that is an ISO date is both a string and a date; a numeric string stays a string.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterator, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any

SOURCE = "caller_metadata"
LEGACY_SOURCE = "metadata"  # chunks written before the typed fields: a dynamic object
VALUES, NUMBERS, DATES = "metadata_values", "metadata_numbers", "metadata_dates"
SEPARATOR = "\x1f"
# Past this, a key's terms sort after every term of the key: the bound of an open range.
_AFTER_KEY = "\x20"
MAX_KEY_CHARS = 200
MAX_VALUE_CHARS = 1024
MAX_DEPTH = 8
MAX_TERMS = 1000

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_ISO_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?"
)

Scalar = str | int | float | bool


def valid_key(key: str) -> bool:
    """A key that can be indexed and filtered: 1..MAX_KEY_CHARS characters, no control characters."""
    return 0 < len(key) <= MAX_KEY_CHARS and not any(ord(c) < 0x20 or c == "\x7f" for c in key)


def encode_number(value: float) -> str:
    """16 hex digits whose byte order is the numbers' order (negative, -0.0 = 0.0, positive)."""
    (bits,) = struct.unpack(">Q", struct.pack(">d", value + 0.0))
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | 1 << 63
    return f"{bits:016x}"


def encode_instant(value: datetime) -> str | None:
    """The instant in UTC, fixed width (a date-time without an offset is taken as UTC); None when
    it falls outside years 1 to 9999 in UTC."""
    try:
        utc = (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)
    except OverflowError:
        return None
    return f"{utc.year:04d}-{utc:%m-%dT%H:%M:%S.%f}Z"


def parse_date(text: str) -> datetime | None:
    """The instant an ISO 8601 date or date-time string names (a date is its midnight, UTC)."""
    try:
        if _ISO_DATE.fullmatch(text):
            return datetime.combine(date.fromisoformat(text), datetime.min.time(), UTC)
        if _ISO_DATE_TIME.fullmatch(text):
            return datetime.fromisoformat(text)
    except ValueError:
        return None
    return None


def _date_term(key: str, text: str) -> str | None:
    instant = parse_date(text)
    encoded = encode_instant(instant) if instant is not None else None
    return _term(key, encoded) if encoded is not None else None


def finite_number(value: int | float) -> float | None:
    """`value` as a float, or None where no finite float holds it (NaN, infinities, huge integers)."""
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _scalars(value: Any, key: str, depth: int) -> Iterator[tuple[str, Scalar]]:
    if isinstance(value, dict):
        if depth >= MAX_DEPTH:
            return
        for name, inner in value.items():
            if isinstance(name, str):
                yield from _scalars(inner, f"{key}.{name}" if key else name, depth + 1)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item, key, depth + 1)
    elif isinstance(value, str | int | float) and valid_key(key):
        yield key, value


def _term(key: str, value: str) -> str:
    return f"{key}{SEPARATOR}{value}"


def indexed_terms(metadata: dict[str, Any]) -> dict[str, list[str]]:
    """The typed terms of a chunk's metadata, by field (see the module docstring)."""
    fields: dict[str, dict[str, None]] = {VALUES: {}, NUMBERS: {}, DATES: {}}
    count = 0
    for key, value in _scalars(metadata, "", 0):
        terms: list[tuple[str, str]] = []
        if isinstance(value, bool):
            terms.append((VALUES, _term(key, "true" if value else "false")))
        elif isinstance(value, str):
            if len(value) <= MAX_VALUE_CHARS:
                terms.append((VALUES, _term(key, value)))
                if (dated := _date_term(key, value)) is not None:
                    terms.append((DATES, dated))
        elif (number := finite_number(value)) is not None:
            terms.append((NUMBERS, _term(key, encode_number(number))))
        for field, term in terms:
            if term not in fields[field]:
                if count == MAX_TERMS:
                    return {f: list(t) for f, t in fields.items()}
                fields[field][term] = None
                count += 1
    return {f: list(t) for f, t in fields.items()}


def with_metadata_fields(source: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """A chunk's source with its caller metadata kept verbatim and indexed as typed terms."""
    rest = {k: v for k, v in source.items() if k != LEGACY_SOURCE}
    return {**rest, SOURCE: metadata, **indexed_terms(metadata)}


def stored_metadata(source: dict[str, Any]) -> dict[str, Any]:
    """The caller metadata of a chunk as stored, whichever version wrote it."""
    found = source.get(SOURCE, source.get(LEGACY_SOURCE))
    return found if isinstance(found, dict) else {}


# Filters -------------------------------------------------------------------------------------


def _any_of(clauses: list[dict[str, Any]]) -> dict[str, Any]:
    if len(clauses) == 1:
        return clauses[0]
    return {"bool": {"should": clauses, "minimum_should_match": 1}}


def one_of(key: str, values: Sequence[Scalar]) -> dict[str, Any]:
    """A clause matching chunks whose `key` holds any of `values`, each compared by its own type:
    a string its string (and, if it is an ISO date, its instant), a bool its bool, a number its
    number."""
    strings: list[str] = []
    numbers: list[str] = []
    dates: list[str] = []
    for value in values:
        if isinstance(value, bool):
            strings.append(_term(key, "true" if value else "false"))
        elif isinstance(value, str):
            strings.append(_term(key, value))
            if (dated := _date_term(key, value)) is not None:
                dates.append(dated)
        elif (number := finite_number(value)) is not None:
            numbers.append(_term(key, encode_number(number)))
    clauses = [
        {"terms": {field: sorted(set(terms))}}
        for field, terms in ((VALUES, strings), (NUMBERS, numbers), (DATES, dates))
        if terms
    ]
    # Only non-finite numbers (the request model refuses them; a caller of this function may not
    # have one): nothing can equal them.
    return _any_of(clauses) if clauses else {"bool": {"must_not": [{"match_all": {}}]}}


Bound = float | date | datetime


def range_bound(value: Any) -> Any:
    """A range bound as a finite float, a datetime or a date; anything else is refused."""
    if value is None or isinstance(value, date):
        return value
    if isinstance(value, bool):
        raise ValueError("a range bound is a number or an ISO 8601 date, not a boolean")
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an integer of hundreds of digits: no float holds it
            raise ValueError("a range bound is a finite number") from None
    elif isinstance(value, str):
        text = value.strip()
        if _ISO_DATE.fullmatch(text):
            try:
                return date.fromisoformat(text)
            except ValueError:
                raise ValueError("a range bound's date is not a calendar date") from None
        instant = parse_date(text)
        if instant is not None:
            return instant
        try:
            number = float(text)
        except ValueError:
            raise ValueError("a range bound is a number or an ISO 8601 date") from None
    else:
        raise ValueError("a range bound is a number or an ISO 8601 date")
    if not math.isfinite(number):
        raise ValueError("a range bound is a finite number")
    return number


def _date_bound(value: date | datetime, operator: str) -> tuple[str, datetime | None]:
    """A date bound as an instant bound; a date without a time covers its whole day (UTC)."""
    if isinstance(value, datetime):
        return operator, value
    start = datetime.combine(value, datetime.min.time(), UTC)
    if operator in ("gte", "lt"):
        return operator, start
    try:
        following = start + timedelta(days=1)
    except OverflowError:
        following = None
    return ("gte" if operator == "gt" else "lt"), following


def in_range(key: str, bounds: dict[str, Bound]) -> dict[str, Any]:
    """A range over one key's numbers or dates (the bounds are all one kind, checked by the model:
    at most one lower and one upper bound)."""
    numeric = all(isinstance(b, int | float) for b in bounds.values())
    query: dict[str, str] = {}
    for given, bound in bounds.items():
        if isinstance(bound, date):
            operator, instant = _date_bound(bound, given)
            encoded = encode_instant(instant) if instant is not None else None
            if encoded is None:  # outside years 1 to 9999: this side is open
                continue
            query[operator] = _term(key, encoded)
        else:
            query[given] = _term(key, encode_number(float(bound)))
    if not {"gt", "gte"} & set(query):
        query["gte"] = key + SEPARATOR
    if not {"lt", "lte"} & set(query):
        query["lt"] = key + _AFTER_KEY
    return {"range": {NUMBERS if numeric else DATES: query}}


def mapping() -> dict[str, Any]:
    """The chunk index fields of caller metadata."""
    term = {"type": "keyword", "ignore_above": MAX_KEY_CHARS + 1 + MAX_VALUE_CHARS}
    return {SOURCE: {"type": "object", "enabled": False}, VALUES: term, NUMBERS: term, DATES: term}

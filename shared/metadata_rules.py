"""The one bound on caller metadata, applied by the ingestor before any byte is stored.

Metadata is copied into the document's registry record and into every chunk, so an unbounded
object made every read, write and delete of that record carry it (and OpenSearch parse it). The
bounds: its serialized size (`RAGLINE_API__MAX_METADATA_BYTES`), the number of keys (counted at
every level, as `shared/search/metadata.py` indexes at most `MAX_TERMS` terms a chunk), the
nesting depth and key length that module indexes, and the length of each list. The walk stops at
the first bound it meets, so a huge object costs no more than the part of it that was read. The
message names the bound, never a key or value: both are caller content.
"""

from __future__ import annotations

import json
import math
from typing import Any

from shared.errors import ErrorCode, RaglineError
from shared.search.metadata import MAX_DEPTH, MAX_KEY_CHARS, MAX_TERMS

MAX_KEYS = MAX_TERMS
MAX_LIST_ITEMS = MAX_TERMS


def _refuse(bound: str, problem: str, limit: int) -> RaglineError:
    return RaglineError(
        f"metadata {problem}",
        code=ErrorCode.INVALID_ARGUMENT,
        details={"field": "metadata", "bound": bound, "limit": limit},
    )


def _check_text(text: str) -> None:
    """A key or a string value: a lone surrogate (an escape `\\ud800` the JSON parser lets by)
    is no Unicode text, and nothing could store it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise _refuse("value_type", "holds a string that is not Unicode text", 0) from None


def _check_keys(value: dict[Any, Any], keys: int) -> None:
    """The keys of one object, `keys` the count so far of every object."""
    if keys > MAX_KEYS:
        raise _refuse("keys", f"has more than {MAX_KEYS} keys", MAX_KEYS)
    for key in value:
        if not isinstance(key, str):
            raise _refuse("key_type", "has a key that is not a string", 0)
        _check_text(key)
        if len(key) > MAX_KEY_CHARS:
            raise _refuse("key_chars", f"has a key longer than {MAX_KEY_CHARS} characters", MAX_KEY_CHARS)


def check_metadata(metadata: object, max_bytes: int) -> dict[str, Any]:
    """The metadata as given when it is a JSON object within the bounds, else INVALID_ARGUMENT."""
    if not isinstance(metadata, dict):
        raise _refuse("type", "must be a JSON object", 0)
    # Every value takes at least two bytes of the JSON (itself and a separator): more values than
    # that cannot fit, and counting them stops there.
    max_values = max_bytes // 2 + 1
    values = 0
    keys = 0
    pending: list[tuple[object, int]] = [(metadata, 1)]
    while pending:
        value, depth = pending.pop()
        values += 1
        if values > max_values:
            raise _refuse("bytes", f"is larger than {max_bytes} bytes as JSON", max_bytes)
        if isinstance(value, dict | list) and depth > MAX_DEPTH:
            raise _refuse("depth", f"nests objects or lists deeper than {MAX_DEPTH} levels", MAX_DEPTH)
        if isinstance(value, dict):
            keys += len(value)
            _check_keys(value, keys)
            pending.extend((child, depth + 1) for child in value.values())
        elif isinstance(value, list):
            if len(value) > MAX_LIST_ITEMS:
                raise _refuse("list_items", f"has a list of more than {MAX_LIST_ITEMS} items", MAX_LIST_ITEMS)
            pending.extend((child, depth + 1) for child in value)
        elif isinstance(value, float) and not math.isfinite(value):
            # NaN, Infinity or a number past a float's range (1e400): no JSON number, and stored
            # it became null.
            raise _refuse("value_type", "holds a number that is not finite", 0)
        elif isinstance(value, str):
            _check_text(value)
        elif not (value is None or isinstance(value, int | float | bool)):
            raise _refuse("value_type", "holds a value that is not JSON", 0)
    size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise _refuse("bytes", f"is larger than {max_bytes} bytes as JSON", max_bytes)
    return metadata

"""The parse sandbox turns runaway work into a document error and keeps the caller alive."""

from __future__ import annotations

import time

import pytest

from shared.errors import ErrorCode, PermanentError
from workers.sandbox import run_limited


def test_result_comes_back() -> None:
    assert run_limited(lambda: {"n": 2}, timeout_s=10, memory_bytes=1 << 30, what="work") == {"n": 2}


def test_memory_bomb_fails_with_parse_error() -> None:
    with pytest.raises(PermanentError) as caught:
        run_limited(lambda: len(bytearray(8 << 30)), timeout_s=20, memory_bytes=256 << 20, what="parsing")
    assert caught.value.code == ErrorCode.PARSE_ERROR


def test_endless_work_times_out() -> None:
    started = time.monotonic()
    with pytest.raises(PermanentError) as caught:
        run_limited(lambda: time.sleep(60), timeout_s=1, memory_bytes=1 << 30, what="parsing")
    assert caught.value.code == ErrorCode.TIMEOUT
    assert time.monotonic() - started < 10

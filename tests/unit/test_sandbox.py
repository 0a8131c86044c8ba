"""The parse sandbox turns runaway work into a document error and keeps the caller alive."""

from __future__ import annotations

import time
from functools import partial

import pytest

from shared.errors import ErrorCode, PermanentError
from workers.sandbox import CAUSE_CHARS, SandboxError, _payload, run_limited


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


def _fails_deep_inside() -> None:
    raise ValueError("Unicode strings with encoding declaration are not supported.")


def test_an_unexpected_failure_keeps_its_cause_for_the_log() -> None:
    with pytest.raises(SandboxError) as caught:
        run_limited(_fails_deep_inside, timeout_s=10, memory_bytes=1 << 30, what="parsing")
    # The user sees the class only; the operator's log gets type, message and the raising line.
    assert caught.value.message == "could not parse the file (ValueError)"
    assert caught.value.cause is not None
    assert caught.value.cause.startswith("ValueError: 'Unicode strings with encoding declaration")
    assert "test_sandbox.py" in caught.value.cause
    assert "in _fails_deep_inside" in caught.value.cause


def test_a_long_message_is_cut_in_the_cause() -> None:
    with pytest.raises(SandboxError) as caught:
        run_limited(lambda: int("9" * 5000, 2), timeout_s=10, memory_bytes=1 << 30, what="parsing")
    assert caught.value.cause is not None
    assert len(caught.value.cause) < CAUSE_CHARS + 200


def escaped_text(mib: int) -> list[str]:
    return ["\x01" * 1024] * (mib << 10)  # six bytes a character in JSON, written piece by piece


def test_a_result_larger_than_the_memory_allowed_is_refused_not_read() -> None:
    with pytest.raises(PermanentError) as caught:
        run_limited(partial(escaped_text, 12), timeout_s=30, memory_bytes=64 << 20, what="parsing")
    assert caught.value.code == ErrorCode.TOO_LARGE


@pytest.mark.parametrize(
    "written",
    [{"error": "NOT_A_CODE", "message": "x"}, {"error": "PARSE_ERROR"}, ["ok", 1], "ok", {"message": "x"}],
)
def test_a_result_of_any_other_shape_is_a_parse_error(written: object) -> None:
    with pytest.raises(PermanentError) as caught:
        _payload(written, "parsing")
    assert caught.value.code == ErrorCode.PARSE_ERROR
    assert caught.value.message == "parsing ended without a result"

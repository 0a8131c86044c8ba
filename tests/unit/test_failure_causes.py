"""A failure the user sees by its class only leaves its cause (type, message, raising line) in the log."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from shared.errors import ErrorCode
from shared.ingest import StageRef
from shared.models import Stage
from workers.failures import classify

REF = StageRef(tenant_id="t", kb_id="kb", doc_id="doc-1", content_version=1, stage=Stage.STORE)


def _raised(error: Exception) -> Exception:
    try:
        raise error
    except Exception as caught:  # noqa: BLE001  (a traceback to describe)
        return caught


@pytest.mark.parametrize(
    ("error", "code", "cause"),
    [
        (
            PermissionError(13, "Permission denied"),
            ErrorCode.UNAVAILABLE,
            "PermissionError: '[Errno 13] Permission denied'",
        ),
        (
            RedisConnectionError("Connection refused"),
            ErrorCode.UNAVAILABLE,
            "ConnectionError: 'Connection refused'",
        ),
    ],
)
def test_the_cause_of_a_classed_failure_is_logged(
    caplog: pytest.LogCaptureFixture, error: Exception, code: ErrorCode, cause: str
) -> None:
    with caplog.at_level(logging.WARNING, logger="workers.failures"):
        classified = classify(REF, _raised(error))
    assert classified.code == code
    assert type(error).__name__ in classified.message
    lines = [r.getMessage() for r in caplog.records if "doc-1" in r.getMessage()]
    assert len(lines) == 1
    assert cause in lines[0]
    assert "test_failure_causes.py" in lines[0]

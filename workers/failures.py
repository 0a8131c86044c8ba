"""Failure classification: what an exception in a stage means for its document.

A stage's failure is one of: an outage (a backing service is down or overloaded: waited out
without limit, never counted), transient (retried with backoff, a bounded number of times) or
permanent (the document fails). Every exception is given its typed class here, and its cause is
logged, since the document's status names the class only.
"""

from __future__ import annotations

import logging
import random

from celery.exceptions import SoftTimeLimitExceeded
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import TransportError
from redis.exceptions import RedisError

from shared.errors import ErrorCode, OutageError, RaglineError, TransientError
from shared.ingest import StageRef
from shared.models import Stage
from workers.sandbox import describe

log = logging.getLogger(__name__)


def is_outage(error: BaseException) -> bool:
    """True when a backing service is unreachable or overloaded, not when a document is bad."""
    if isinstance(error, OutageError | OpenSearchConnectionError | RedisError):
        return True
    return isinstance(error, TransportError) and error.status_code in (429, 502, 503, 504)


def outage_countdown() -> float:
    """Seconds before a stage blocked by an outage tries again: short, jittered, never used up."""
    return random.uniform(2.0, 10.0)  # noqa: S311  (jitter, not security)


def backoff(attempt: int, cap: float) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, 2.0**attempt))  # noqa: S311  (jitter, not security)


def retry_countdown(failure: RaglineError, retries_done: int, cap: float) -> float:
    """Seconds before a retryable failure's stage runs again: an outage's short wait, or backoff."""
    if isinstance(failure, OutageError):
        return outage_countdown()
    return backoff(retries_done + 1, cap)


def classify(ref: StageRef, error: Exception) -> RaglineError:
    """The typed failure behind an exception: transient ones retry, the rest fail the document."""
    if isinstance(error, RaglineError):
        return error
    if isinstance(error, SoftTimeLimitExceeded):
        if ref.stage == Stage.EMBED:
            # Embedding keeps each slice's vectors as it goes (workers/stages/embed.py): a retry
            # goes on from there, so a document larger than one time limit still gets through.
            return TransientError(f"the {ref.stage} stage ran out of time", code=ErrorCode.TIMEOUT)
        return RaglineError(f"the {ref.stage} stage ran out of time", code=ErrorCode.TIMEOUT)
    if isinstance(error, TransportError) and is_outage(error):
        return OutageError(f"OpenSearch is unavailable or overloaded ({error.status_code})")
    if is_outage(error) or isinstance(error, OSError):
        # The document's status names the class only; the operator needs the cause.
        log.warning("%s for %s/%s failed: %s", ref.stage, ref.kb_id, ref.doc_id, describe(error))
    if is_outage(error):
        return OutageError(f"a backing service is unavailable ({type(error).__name__})")
    if isinstance(error, OSError):
        return TransientError(f"a file operation failed ({type(error).__name__})")
    # A bug or an unexpected library failure: retried (bounded), logged with its traceback here,
    # and reported to the user without one.
    log.exception("unexpected error in %s for %s/%s", ref.stage, ref.kb_id, ref.doc_id, exc_info=error)
    internal = TransientError(f"internal error in the {ref.stage} stage ({type(error).__name__})")
    internal.code = ErrorCode.INTERNAL
    return internal

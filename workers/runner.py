"""Runs one pipeline stage for one document: claim, work, record, hand off.

Fencing: a stage task carries the document's `content_version` and the stage it is for. It works
only if the registry still shows that version at that stage, and it claims the document with an
optimistic write (seq_no) and a lease. A duplicate or stale delivery finds the record moved on,
or claimed under a live lease, and does nothing. Stage outputs are artifacts keyed by
(document, version, stage), so a redelivered stage overwrites rather than duplicates.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NoReturn

from celery.exceptions import SoftTimeLimitExceeded
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError
from opensearchpy.exceptions import TransportError
from redis.exceptions import RedisError

from shared import tracing
from shared.errors import ErrorCode, OutageError, RaglineError, TransientError
from shared.ingest import QUEUE_LEASE, STAGE_TASK, StageRef, hand_to_reconciler
from shared.models import PIPELINE, STAGE_STATUS, DocStatus, Document, ErrorInfo, Stage, utcnow
from shared.queue import enqueue, stage_queue
from shared.registry import Conflict, Versioned
from shared.stage_metrics import record_stage
from workers import metrics
from workers.context import WorkerContext
from workers.lease import LeaseKeeper

log = logging.getLogger(__name__)

PEER_DOCS = 31  # documents taken along by a batched stage, besides its own
BATCHED_STAGES = frozenset({Stage.EMBED})
MAX_TRANSITIONS = 64
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class StageResult:
    """What a stage produced: the artifact for the next stage and registry fields to set."""

    artifact: Any
    updates: dict[str, Any] = field(default_factory=dict)
    # Runs only after the registry recorded this result (e.g. retiring an old generation).
    after: Callable[[], None] | None = None


StageFn = Callable[[WorkerContext, Document, Any], StageResult]
# A stage that can run several documents at once; one result (or error) per document, in order.
BatchFn = Callable[[WorkerContext, list[tuple[Document, Any]]], list["StageResult | RaglineError"]]


class Done(Exception):
    """Raised to the task wrapper: this delivery is finished (the document was failed)."""


class Retry(Exception):
    """Raised to the task wrapper: send this stage again after `countdown` seconds.

    An uncounted retry (a backing service is down) does not use up the task's retries.
    """

    def __init__(self, countdown: float, *, counted: bool = True) -> None:
        super().__init__(f"retry in {countdown:.1f}s")
        self.countdown = countdown
        self.counted = counted


def is_outage(error: BaseException) -> bool:
    """True when a backing service is unreachable or overloaded, not when a document is bad."""
    if isinstance(error, OutageError | OpenSearchConnectionError | RedisError):
        return True
    return isinstance(error, TransportError) and error.status_code in (429, 502, 503, 504)


def outage_countdown() -> float:
    """Seconds before a stage blocked by an outage tries again: short, jittered, never used up."""
    return random.uniform(2.0, 10.0)  # noqa: S311  (jitter, not security)


def _ref_fields(ref: StageRef) -> dict[str, Any]:
    return {
        "tenant_id": ref.tenant_id,
        "kb_id": ref.kb_id,
        "doc_id": ref.doc_id,
        "content_version": ref.content_version,
    }


def artifact_key(ref: StageRef, stage: Stage) -> str:
    return f"{ref.tenant_id}/{ref.kb_id}/{ref.doc_id}/v{ref.content_version}/{stage.value}"


def _status_before(stage: Stage) -> DocStatus:
    return DocStatus.QUEUED if stage == Stage.PARSE else STAGE_STATUS[stage]


def _next_stage(stage: Stage) -> Stage | None:
    position = PIPELINE.index(stage)
    return PIPELINE[position + 1] if position + 1 < len(PIPELINE) else None


def _record(doc: Document, status: DocStatus) -> None:
    doc.status = status
    doc.transitions = [*doc.transitions, {"status": status.value, "at": utcnow().isoformat()}][
        -MAX_TRANSITIONS:
    ]


def _claim(ctx: WorkerContext, ref: StageRef, attempt_limit: int) -> Versioned | None:
    """Take the document for this stage, or None when this delivery is stale or a duplicate."""
    current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
    if current is None:
        return None
    doc = current.doc
    if doc.content_version != ref.content_version:
        return None  # superseded by a newer version, whose own pipeline runs
    if doc.status not in (_status_before(ref.stage), STAGE_STATUS[ref.stage]):
        return None  # already past this stage, failed or deleted
    now = utcnow()
    if doc.claimed_by is not None and doc.lease_until is not None and doc.lease_until > now:
        return None  # another delivery holds a live lease
    if doc.stage != ref.stage:
        doc.attempts = 0
    doc.attempts += 1
    if doc.attempts > attempt_limit:
        _fail(
            doc,
            ref.stage,
            RaglineError(
                "the stage was started too many times without finishing",
                code=ErrorCode.RETRIES_EXHAUSTED,
            ),
            previous=doc.error,
        )
        ctx.registry.replace_doc(current, doc)
        metrics.document_failed(ref.stage.value, ErrorCode.RETRIES_EXHAUSTED.value)
        return None
    if doc.status != STAGE_STATUS[ref.stage]:
        _record(doc, STAGE_STATUS[ref.stage])
    doc.stage = ref.stage
    doc.claimed_by = WORKER_ID
    doc.lease_until = now + stage_lease(ctx)
    try:
        return ctx.registry.replace_doc(current, doc)
    except Conflict:
        return None  # another worker claimed it first


def stage_lease(ctx: WorkerContext) -> timedelta:
    return timedelta(seconds=ctx.settings.celery.stage_lease_s)


def _fail(doc: Document, stage: Stage, error: RaglineError, previous: ErrorInfo | None = None) -> None:
    message = error.message
    if previous is not None and error.code == ErrorCode.RETRIES_EXHAUSTED:
        message = f"{message}; last error: {previous.code}: {previous.message}"
    doc.error = ErrorInfo(code=error.code.value, stage=stage.value, message=message, retryable=False)
    _record(doc, DocStatus.FAILED)
    doc.claimed_by = None
    doc.lease_until = None


def _load_input(ctx: WorkerContext, ref: StageRef, doc: Document) -> Any:
    if ref.stage == Stage.PARSE:
        return ctx.blobs.path_of(doc.content_hash)
    previous = PIPELINE[PIPELINE.index(ref.stage) - 1]
    return ctx.blobs.get_artifact(artifact_key(ref, previous))


def backoff(attempt: int, cap: float) -> float:
    """Exponential backoff with full jitter."""
    return random.uniform(0, min(cap, 2.0**attempt))  # noqa: S311  (jitter, not security)


def run_stage(
    ctx: WorkerContext, ref: StageRef, fn: StageFn, retries_done: int, *, batch_fn: BatchFn | None = None
) -> None:
    """Run `fn` for the document in `ref` and hand the document to the next stage.

    With `batch_fn`, the task also takes other documents waiting at the same stage and runs them
    together (embedding many small documents in one model batch). Their own queued tasks then
    find them moved on and do nothing.
    """
    celery = ctx.settings.celery
    claimed = _claim(ctx, ref, attempt_limit=celery.max_retries + 1)
    if claimed is None:
        log.info(
            "skip %s for %s/%s v%d: stale or duplicate", ref.stage, ref.kb_id, ref.doc_id, ref.content_version
        )
        return
    items = [(ref, claimed)]
    traces: dict[StageRef, dict[str, str]] = {}
    if batch_fn is not None:
        items += _claim_peers(ctx, ref, celery.max_retries + 1, traces)
    started = time.perf_counter()
    produced: list[StageResult | RaglineError] | Exception
    with LeaseKeeper(ctx.registry, [c for _, c in items], stage_lease(ctx)) as keeper:
        try:
            inputs = [(c.doc, _load_input(ctx, r, c.doc)) for r, c in items]
            produced = batch_fn(ctx, inputs) if batch_fn is not None else [fn(ctx, claimed.doc, inputs[0][1])]
        except Exception as error:  # noqa: BLE001  (every failure is classified; none escapes untyped)
            produced = error
    items = [(r, c) for (r, _), c in zip(items, keeper.claims(), strict=True)]
    if isinstance(produced, Exception):
        failure = classify(ref, produced)
        retrying = isinstance(failure, OutageError) or retries_done < celery.max_retries
        outcome = "retry" if failure.retryable and retrying else "failed"
        for _ in items:
            metrics.stage_observed(ref.stage.value, outcome, (time.perf_counter() - started) / len(items))
        if failure.retryable:
            _retry_or_fail(ctx, items, failure, retries_done)
        for item_ref, _ in items:
            _finish_failed(ctx, item_ref, failure)
        return
    results = produced
    elapsed = time.perf_counter() - started
    weights = [max(1, c.doc.chunk_count) for _, c in items]
    for (item_ref, item_claim), result, weight in zip(items, results, weights, strict=True):
        if isinstance(result, RaglineError):
            metrics.stage_observed(ref.stage.value, "failed", elapsed * weight / sum(weights))
            _finish_failed(ctx, item_ref, result)
        else:
            with _peer_span(traces, item_ref):
                _advance(ctx, item_ref, item_claim, result, elapsed * weight / sum(weights))


def classify(ref: StageRef, error: Exception) -> RaglineError:
    """The typed failure behind an exception: transient ones retry, the rest fail the document."""
    if isinstance(error, RaglineError):
        return error
    if isinstance(error, SoftTimeLimitExceeded):
        return RaglineError(f"the {ref.stage} stage ran out of time", code=ErrorCode.TIMEOUT)
    if isinstance(error, TransportError) and is_outage(error):
        return OutageError(f"OpenSearch is unavailable or overloaded ({error.status_code})")
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


def _retry_or_fail(
    ctx: WorkerContext, items: list[tuple[StageRef, Versioned]], error: RaglineError, retries_done: int
) -> NoReturn:
    """Release every claimed document; retry the task's own document later, or fail it for good.

    An outage is waited out without limit: the document is fine, its backing service is not.
    """
    celery = ctx.settings.celery
    (own_ref, own), peers = items[0], items[1:]
    _release_for_retry(ctx, own_ref, own, error)
    for peer_ref, peer in peers:
        # A peer's own task may have come and gone while this one held it: send it again, even
        # when the release fails (it may have landed all the same; if not, the claim's lease runs
        # out and the reconciler sends it).
        try:
            _release_for_retry(ctx, peer_ref, peer, error)
        finally:
            _send(ctx, peer_ref, peer.doc.queue)
    if isinstance(error, OutageError):
        metrics.retried(own_ref.stage.value, error.code.value)
        raise Retry(outage_countdown(), counted=False)
    if retries_done >= celery.max_retries:
        _finish_failed(ctx, own_ref, RaglineError(error.message, code=ErrorCode.RETRIES_EXHAUSTED))
        raise Done
    metrics.retried(own_ref.stage.value, error.code.value)
    raise Retry(backoff(retries_done + 1, celery.retry_backoff_max_s))


def waiting_key(stage: Stage) -> str:
    return f"ragline:waiting:{stage.value}"


def _claim_peers(
    ctx: WorkerContext, ref: StageRef, attempt_limit: int, traces: dict[StageRef, dict[str, str]]
) -> list[tuple[StageRef, Versioned]]:
    """Claim other documents waiting at this stage (announced in Redis on arrival), up to the limit.

    Redis is read at once, unlike the registry's search side; a lost announcement only means a
    smaller batch, since every document's own task still comes. Each announcement carries its
    document's trace context, kept in `traces`, so a peer's next stage stays in its own trace.
    """
    peers = []
    popped = ctx.redis.spop(waiting_key(ref.stage), PEER_DOCS)
    announced: list[bytes] = popped if isinstance(popped, list) else []
    for raw in announced:
        fields = json.loads(raw)
        trace = {name: fields.pop(name) for name in tracing.HEADERS if name in fields}
        peer_ref = StageRef(**{**fields, "stage": ref.stage})
        traces[peer_ref] = trace
        if (peer_ref.tenant_id, peer_ref.kb_id, peer_ref.doc_id) == (ref.tenant_id, ref.kb_id, ref.doc_id):
            continue
        peer = _claim(ctx, peer_ref, attempt_limit)
        if peer is not None:
            peers.append((peer_ref, peer))
    return peers


def _peer_span(
    traces: dict[StageRef, dict[str, str]], ref: StageRef
) -> contextlib.AbstractContextManager[Any]:
    """The span of a peer's share of a batched stage, in the peer's own trace (none for the task's own)."""
    if not traces.get(ref):
        return contextlib.nullcontext()
    return tracing.span(f"stage {ref.stage.value}", traces[ref], doc_id=ref.doc_id, stage=ref.stage.value)


def _release_for_retry(ctx: WorkerContext, ref: StageRef, claimed: Versioned, error: RaglineError) -> None:
    doc = claimed.doc
    doc.error = ErrorInfo(code=error.code.value, stage=ref.stage.value, message=error.message, retryable=True)
    # A clean release is not a lost claim: only claims whose worker died count towards the limit.
    doc.attempts = max(0, doc.attempts - 1)
    doc.claimed_by = None
    doc.lease_until = utcnow() + QUEUE_LEASE
    with contextlib.suppress(Conflict):  # superseded meanwhile: nothing of ours to release
        ctx.registry.replace_doc(claimed, doc)


def _finish_failed(ctx: WorkerContext, ref: StageRef, error: RaglineError) -> None:
    for _ in range(5):
        current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
        if current is None or current.doc.content_version != ref.content_version:
            return
        _fail(current.doc, ref.stage, error)
        try:
            ctx.registry.replace_doc(current, current.doc)
            metrics.document_failed(ref.stage.value, error.code.value)
            log.warning("document %s/%s failed at %s: %s", ref.kb_id, ref.doc_id, ref.stage, error)
            return
        except Conflict:
            continue


def _advance(
    ctx: WorkerContext, ref: StageRef, claimed: Versioned, result: StageResult, elapsed: float
) -> None:
    nxt = _next_stage(ref.stage)
    if nxt is not None:
        ctx.blobs.put_artifact(artifact_key(ref, ref.stage), result.artifact)
    doc = claimed.doc
    for name, value in result.updates.items():
        setattr(doc, name, value)
    doc.timings = {**doc.timings, ref.stage.value: round(elapsed, 4)}
    with contextlib.suppress(Exception):  # metrics never fail a document
        record_stage(ctx.redis, ref.stage.value, elapsed)
    metrics.stage_observed(ref.stage.value, "ok", elapsed)
    doc.progress = max(doc.progress, (PIPELINE.index(ref.stage) + 1) / len(PIPELINE))
    doc.error = None
    doc.claimed_by = None
    if nxt is None:
        _record(doc, DocStatus.READY)
        doc.stage = None
        doc.lease_until = None
        doc.progress = 1.0
    else:
        _record(doc, STAGE_STATUS[nxt])
        doc.stage = nxt
        doc.attempts = 0
        doc.lease_until = utcnow() + QUEUE_LEASE
    try:
        ctx.registry.replace_doc(claimed, doc)
    except Conflict:
        # Superseded while working (a new version or a delete). The newer state wins; the
        # artifacts written above belong to this version only and are never read by another.
        log.info("document %s/%s changed during %s; dropping this result", ref.kb_id, ref.doc_id, ref.stage)
        return
    except Exception as error:
        if nxt is not None and is_outage(error):
            # A node that stops mid-request can apply the hand-over and lose only the reply. Had
            # it landed, nothing would send the next stage: the document would sit unclaimed at
            # it for its whole queue lease. So send it anyway; if the write did not land, that
            # task finds the document still at this stage and drops itself.
            _send(ctx, StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt), doc.queue)
        raise
    if result.after is not None:
        result.after()
    if nxt is None:
        metrics.document_ready()
        log.info("document %s/%s ready: %d chunks", ref.kb_id, ref.doc_id, doc.chunk_count)
        ctx.blobs.drop_artifacts(artifact_key(ref, stage) for stage in PIPELINE)
        return
    next_ref = StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt)
    if nxt in BATCHED_STAGES:
        with contextlib.suppress(RedisError):  # only an optimisation: the task below still runs
            ctx.redis.sadd(waiting_key(nxt), json.dumps({**next_ref.as_kwargs(), **tracing.carrier()}))
    _send(ctx, next_ref, doc.queue)


def _send(ctx: WorkerContext, ref: StageRef, queue: str) -> None:
    try:
        routed = stage_queue(ctx.settings, queue, ref.stage)
        enqueue(ctx.sender, ctx.settings, STAGE_TASK, kwargs=ref.as_kwargs(), queue=routed)
    except Exception:  # noqa: BLE001  (broker unreachable: the reconciler sends it again)
        log.warning("enqueue of %s failed for %s/%s", ref.stage, ref.kb_id, ref.doc_id)
        hand_to_reconciler(ctx.registry, ref)

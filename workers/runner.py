"""Runs one pipeline stage for one document: claim, work, record, hand off.

Fencing: a stage task carries the document's `content_version` and the stage it is for. It works
only if the registry still shows that version at that stage, and it claims the document with an
optimistic write (seq_no) and a lease. A duplicate or stale delivery finds the record moved on,
or claimed under a live lease, and does nothing. Stage outputs are artifacts keyed by
(document, version, stage), so a redelivered stage overwrites rather than duplicates.

Chaining: when the next stage goes to the same queue, the task runs it at once in the same
process instead of sending it through the broker. The hand-over is then also the claim of the
next stage (claimed_by, a stage lease), and into a light stage (not store), while the claim's
lease has more than half a stage lease left, it is not written at all: the next write (a
hand-over that leaves the chain, a lease renewal, a release or a failure) records it, fenced by
the same seq_no. So a light chained stage costs no registry write instead of a write, a read,
another write and a broker round trip, and still leaves every status, timing and artifact as a
sent stage would: a worker that dies mid-chain leaves the document claimed at the last stage
written, and the reconciler sends that stage when the lease runs out (its input is in the blob
store: every stage writes its artifact).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections import deque
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, NoReturn

from redis.exceptions import RedisError

from shared import blobs, logs, tracing
from shared.errors import ErrorCode, OutageError, RaglineError
from shared.ingest import QUEUE_LEASE, STAGE_TASK, StageRef, hand_to_reconciler
from shared.models import PIPELINE, STAGE_STATUS, DocStatus, Document, ErrorInfo, Stage, utcnow
from shared.queue import enqueue, stage_queue
from shared.registry import Conflict, Versioned
from shared.stage_metrics import record_stage
from workers import metrics
from workers.context import WorkerContext
from workers.failures import backoff, classify, is_outage, outage_countdown
from workers.lease import LeaseKeeper
from workers.stages.base import BATCHED_STAGES, StageResult, Stages

log = logging.getLogger(__name__)

PEER_DOCS = 31  # documents taken along by a batched stage, besides its own
MAX_TRANSITIONS = 64
WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


_UNREAD = object()  # a stage input still in the blob store (the stage before ran in another task)


@dataclass(frozen=True)
class _Item:
    """A document claimed for a stage; `artifact` is its input when the stage before ran here."""

    ref: StageRef
    claim: Versioned
    artifact: Any = _UNREAD
    trace: dict[str, str] | None = None  # the parent of a chained stage's span


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


def _ref_fields(ref: StageRef) -> dict[str, Any]:
    return {
        "tenant_id": ref.tenant_id,
        "kb_id": ref.kb_id,
        "doc_id": ref.doc_id,
        "content_version": ref.content_version,
    }


def artifact_key(ref: StageRef, stage: Stage) -> str:
    return blobs.artifact_key(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, stage.value)


def _drop_artifacts(ctx: WorkerContext, ref: StageRef, *, older: bool = True) -> None:
    """Remove what the stages of this version (and, with `older`, of every version before it)
    handed on: the parsed text and the chunks before redaction among it. Kept by a version that
    failed or was superseded, they were raw document text left in the blob store."""
    first = 1 if older else ref.content_version
    versions = range(first, ref.content_version + 1)
    ctx.blobs.drop_artifacts(blobs.version_artifact_keys(ref.tenant_id, ref.kb_id, ref.doc_id, versions))


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
        _drop_artifacts(ctx, ref)
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
    """The stage's input as the stage before left it in the blob store (parse: the document's bytes)."""
    if ref.stage == Stage.PARSE:
        return ctx.blobs.path_of(doc.content_hash)
    previous = PIPELINE[PIPELINE.index(ref.stage) - 1]
    return ctx.blobs.get_artifact(artifact_key(ref, previous))


def run_stage(ctx: WorkerContext, ref: StageRef, stages: Stages, retries_done: int) -> None:
    """Run the stage in `ref` for its document, then hand the document to the next stage.

    A batched stage also takes other documents waiting at it (embedding many small documents in
    one model batch); their own queued tasks then find them moved on and do nothing. The stages
    that follow run here too while they chain (see the module docstring), for half the task's
    soft time limit at most: a chain never outlives the limit a single stage has. The task reads
    each knowledge base once, so all its stages see the same settings.
    """
    with ctx.registry.kb_snapshots():
        _run_task(ctx, ref, stages, retries_done)


def _run_task(ctx: WorkerContext, ref: StageRef, stages: Stages, retries_done: int) -> None:
    celery = ctx.settings.celery
    claimed = _claim(ctx, ref, attempt_limit=celery.max_retries + 1)
    if claimed is None:
        log.info(
            "skip %s for %s/%s v%d: stale or duplicate", ref.stage, ref.kb_id, ref.doc_id, ref.content_version
        )
        return
    items = [_Item(ref, claimed)]
    traces: dict[StageRef, dict[str, str]] = {}
    if ref.stage in stages.batches:
        peers = _claim_peers(ctx, ref, celery.max_retries + 1, traces)
        items += [_Item(peer_ref, peer) for peer_ref, peer in peers]
    chain_until = time.monotonic() + celery.soft_time_limit_s / 2
    pending = deque(_run_claimed(ctx, items, stages, retries_done, traces, chain_until))
    while pending:
        # Documents a batch handed on together stay together where the next stage batches too.
        group = [pending.popleft()]
        if group[0].ref.stage in stages.batches:
            group += [i for i in pending if i.ref.stage == group[0].ref.stage]
            pending = deque(i for i in pending if i.ref.stage != group[0].ref.stage)
        pending.extend(_run_chained(ctx, group, stages, chain_until))


def _run_chained(ctx: WorkerContext, items: list[_Item], stages: Stages, chain_until: float) -> list[_Item]:
    """A chained stage, as its own task would run it: its own span, log fields and retries (the
    first document's; the others' spans are their hand-overs, as for a batch's peers)."""
    ref = items[0].ref
    fields = {"tenant": ref.tenant_id, "kb": ref.kb_id, "doc_id": ref.doc_id, "stage": ref.stage.value}
    queue = items[0].claim.doc.queue
    traces = {i.ref: i.trace for i in items[1:] if i.trace}
    with logs.bound(**fields), tracing.span(f"stage {ref.stage.value}", items[0].trace, **fields):
        try:
            return _run_claimed(ctx, items, stages, 0, traces, chain_until)
        except Done:
            pass
        except Retry as retry:
            # What the stage's own task would do on Celery's retry: the same stage, later, counted.
            _send(ctx, ref, queue, countdown=retry.countdown, retries=1 if retry.counted else 0)
        except Exception as error:
            if not is_outage(error):
                # Left claimed: the reconciler sends the stage again when its lease runs out.
                log.exception("chained %s failed for %s/%s", ref.stage, ref.kb_id, ref.doc_id)
            else:
                _send(ctx, ref, queue, countdown=outage_countdown())
    return []


def _run_claimed(
    ctx: WorkerContext,
    items: list[_Item],
    stages: Stages,
    retries_done: int,
    traces: dict[StageRef, dict[str, str]],
    chain_until: float,
) -> list[_Item]:
    """Run one stage for claimed documents (the first is the task's own); returns those chained on."""
    celery = ctx.settings.celery
    ref = items[0].ref
    fn, batch_fn = stages.functions[ref.stage], stages.batches.get(ref.stage)
    started = time.perf_counter()
    produced: list[StageResult | RaglineError] | Exception
    with LeaseKeeper(ctx.registry, [i.claim for i in items], stage_lease(ctx)) as keeper:
        try:
            inputs = [(i.claim.doc, _input(ctx, i)) for i in items]
            produced = batch_fn(ctx, inputs) if batch_fn is not None else [fn(ctx, *inputs[0])]
        except Exception as error:  # noqa: BLE001  (every failure is classified; none escapes untyped)
            produced = error
    items = [replace(i, claim=c) for i, c in zip(items, keeper.claims(), strict=True)]
    if isinstance(produced, Exception):
        failure = classify(ref, produced)
        retrying = isinstance(failure, OutageError) or retries_done < celery.max_retries
        outcome = "retry" if failure.retryable and retrying else "failed"
        for _ in items:
            metrics.stage_observed(ref.stage.value, outcome, (time.perf_counter() - started) / len(items))
        if failure.retryable:
            _retry_or_fail(ctx, [(i.ref, i.claim) for i in items], failure, retries_done)
        for item in items:
            _finish_failed(ctx, item.ref, failure, item.claim)
        return []
    elapsed = time.perf_counter() - started
    weights = [max(1, i.claim.doc.chunk_count) for i in items]
    chained: list[_Item] = []
    for item, result, weight in zip(items, produced, weights, strict=True):
        if isinstance(result, RaglineError):
            metrics.stage_observed(ref.stage.value, "failed", elapsed * weight / sum(weights))
            _finish_failed(ctx, item.ref, result, item.claim)
            continue
        may_chain = time.monotonic() < chain_until
        # A batch's peers log under their own ids and record their share in their own traces.
        mine = {"tenant": item.ref.tenant_id, "kb": item.ref.kb_id, "doc_id": item.ref.doc_id}
        with logs.bound(**mine), _peer_span(traces, item.ref):
            share = elapsed * weight / sum(weights)
            following = _advance(ctx, item.ref, item.claim, result, share, stages if may_chain else None)
        if following is not None:
            chained.append(following)
    return chained


def _input(ctx: WorkerContext, item: _Item) -> Any:
    if item.artifact is not _UNREAD:
        return item.artifact
    return _load_input(ctx, item.ref, item.claim.doc)


def _retry_or_fail(
    ctx: WorkerContext, items: list[tuple[StageRef, Versioned]], error: RaglineError, retries_done: int
) -> NoReturn:
    """Release every claimed document; retry the task's own document later, or fail it for good.

    An outage is waited out without limit: the document is fine, its backing service is not.
    """
    celery = ctx.settings.celery
    (own_ref, own), peers = items[0], items[1:]
    outage = isinstance(error, OutageError)
    countdown = outage_countdown() if outage else backoff(retries_done + 1, celery.retry_backoff_max_s)
    # The task's resend covers its own document: should this process die before sending it, the
    # document waits one stage lease past the countdown for the reconciler, not the queue lease.
    resent_by = utcnow() + timedelta(seconds=countdown) + stage_lease(ctx)
    _release_for_retry(ctx, own_ref, own, error, resent_by)
    for peer_ref, peer in peers:
        # A peer's own task may have come and gone while this one held it: send it again, even
        # when the release fails (it may have landed all the same; if not, the claim's lease runs
        # out and the reconciler sends it).
        try:
            _release_for_retry(ctx, peer_ref, peer, error, utcnow() + QUEUE_LEASE)
        finally:
            _send(ctx, peer_ref, peer.doc.queue)
    if outage:
        metrics.retried(own_ref.stage.value, error.code.value)
        raise Retry(countdown, counted=False)
    if retries_done >= celery.max_retries:
        _finish_failed(ctx, own_ref, RaglineError(error.message, code=ErrorCode.RETRIES_EXHAUSTED))
        raise Done
    metrics.retried(own_ref.stage.value, error.code.value)
    raise Retry(countdown)


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


def _release_for_retry(
    ctx: WorkerContext, ref: StageRef, claimed: Versioned, error: RaglineError, lease_until: datetime
) -> None:
    doc = claimed.doc
    doc.error = ErrorInfo(code=error.code.value, stage=ref.stage.value, message=error.message, retryable=True)
    # A clean release is not a lost claim: only claims whose worker died count towards the limit.
    doc.attempts = max(0, doc.attempts - 1)
    doc.claimed_by = None
    doc.lease_until = lease_until
    with contextlib.suppress(Conflict):  # superseded meanwhile: nothing of ours to release
        ctx.registry.replace_doc(claimed, doc)


def _finish_failed(
    ctx: WorkerContext, ref: StageRef, error: RaglineError, claimed: Versioned | None = None
) -> None:
    """Fail the document at `ref`'s stage for good.

    `claimed` is this process's claim, where it still holds one: its record in memory also has
    what chained hand-overs left unwritten (the timings and transitions of the stages since the
    last write), which a record read back would lose. Once another write has moved the record on,
    the stored one is failed instead, if it is still this version.
    """
    current = claimed
    for _ in range(5):
        if current is None:
            current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
        if current is None or current.doc.content_version != ref.content_version:
            return
        _fail(current.doc, ref.stage, error)
        try:
            ctx.registry.replace_doc(current, current.doc)
            metrics.document_failed(ref.stage.value, error.code.value)
            log.warning("document %s/%s failed at %s: %s", ref.kb_id, ref.doc_id, ref.stage, error)
            _drop_artifacts(ctx, ref)
            return
        except Conflict:
            current = None


def _chains(ctx: WorkerContext, doc: Document, stage: Stage, nxt: Stage, stages: Stages | None) -> bool:
    """Whether this task runs `nxt` itself: a chained stage that goes to the queue `stage` came from."""
    if stages is None or nxt not in stages.chained:
        return False
    return stage_queue(ctx.settings, doc.queue, nxt) == stage_queue(ctx.settings, doc.queue, stage)


def _advance(
    ctx: WorkerContext,
    ref: StageRef,
    claimed: Versioned,
    result: StageResult,
    elapsed: float,
    stages: Stages | None = None,
) -> _Item | None:
    """Record the stage's result and hand the document on: to the next stage's task, or (when it
    chains, given `stages`) to this task, returned claimed with its input."""
    nxt = _next_stage(ref.stage)
    if nxt is not None:
        ctx.blobs.put_artifact(artifact_key(ref, ref.stage), result.artifact)
    doc = claimed.doc
    chain = nxt is not None and _chains(ctx, doc, ref.stage, nxt, stages)
    # Into store the hand-over is written: a process that dies mid-store then leaves the document
    # at store (whose input is the embedded chunks) instead of at embed, and the store of a long
    # document, hundreds of chunks in bulk, is a stage worth seeing.
    deferred = chain and nxt not in BATCHED_STAGES and result.after is None and _lease_outlasts_half(ctx, doc)
    claim_until = (doc.lease_until if deferred else utcnow() + stage_lease(ctx)) if chain else None
    _apply_result(ctx, doc, ref.stage, nxt, result, elapsed, claim_until)
    if deferred and nxt is not None:
        # The registry still holds this task's claim on the document, so the next stage's write
        # (its hand-over, a lease renewal, a release or a failure) records this one as well, and
        # its seq_no still fences it. A process that dies before then leaves the document claimed
        # at an earlier stage: the reconciler sends that stage again once the lease runs out, and
        # its input is in the blob store (the artifact above is written all the same).
        next_ref = StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt)
        return _Item(next_ref, claimed, result.artifact, tracing.carrier())
    try:
        written = ctx.registry.replace_doc(claimed, doc)
    except Conflict:
        # Superseded while working (a new version or a delete). The newer state wins; the
        # artifacts written above belong to this version only and are never read by another.
        # (A conflict within this version, a resend by the reconciler, leaves them to that run.)
        log.info("document %s/%s changed during %s; dropping this result", ref.kb_id, ref.doc_id, ref.stage)
        now = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
        if now is None or now.doc.content_version != ref.content_version:
            _drop_artifacts(ctx, ref, older=False)
        return None
    except Exception as error:
        if nxt is not None and is_outage(error):
            # A node that stops mid-request can apply the hand-over and lose only the reply. Had
            # it landed, nothing would send the next stage: the document would sit unclaimed at
            # it for its whole queue lease. So send it anyway; if the write did not land, that
            # task finds the document still at this stage and drops itself. (A chained hand-over
            # that landed holds a stage lease: that task drops itself too, and the reconciler
            # sends the stage when the lease runs out.)
            _send(ctx, StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt), doc.queue)
        raise
    if result.after is not None:
        result.after()
    if nxt is None:
        metrics.document_ready()
        log.info("document %s/%s ready: %d chunks", ref.kb_id, ref.doc_id, doc.chunk_count)
        _drop_artifacts(ctx, ref)  # and those of versions superseded before they finished
        return None
    next_ref = StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt)
    if chain:
        return _Item(next_ref, written, result.artifact, tracing.carrier())
    if nxt in BATCHED_STAGES:
        with contextlib.suppress(RedisError):  # only an optimisation: the task below still runs
            ctx.redis.sadd(waiting_key(nxt), json.dumps({**next_ref.as_kwargs(), **tracing.carrier()}))
    _send(ctx, next_ref, doc.queue)
    return None


def _apply_result(
    ctx: WorkerContext,
    doc: Document,
    stage: Stage,
    nxt: Stage | None,
    result: StageResult,
    elapsed: float,
    claim_until: datetime | None,
) -> None:
    """The document as the stage leaves it: its updates, timing and progress, at the next stage
    (claimed by this process until `claim_until` when it chains) or ready."""
    for name, value in result.updates.items():
        setattr(doc, name, value)
    doc.timings = {**doc.timings, stage.value: round(elapsed, 4)}
    with contextlib.suppress(Exception):  # metrics never fail a document
        record_stage(ctx.redis, stage.value, elapsed)
    metrics.stage_observed(stage.value, "ok", elapsed)
    doc.progress = max(doc.progress, (PIPELINE.index(stage) + 1) / len(PIPELINE))
    doc.error = None
    doc.claimed_by = None
    if nxt is None:
        _record(doc, DocStatus.READY)
        doc.stage = None
        doc.lease_until = None
        doc.progress = 1.0
        return
    _record(doc, STAGE_STATUS[nxt])
    doc.stage = nxt
    doc.attempts = 0
    doc.lease_until = utcnow() + QUEUE_LEASE
    if claim_until is not None:  # the hand-over is also the next stage's claim, as _claim would write it
        doc.attempts = 1
        doc.claimed_by = WORKER_ID
        doc.lease_until = claim_until


def _lease_outlasts_half(ctx: WorkerContext, doc: Document) -> bool:
    """Whether the claim's lease has more than half a stage lease left: a chained hand-over that
    is not written does not renew it, and the next stage's heartbeat starts only a quarter lease
    in."""
    left = (doc.lease_until - utcnow()) if doc.lease_until is not None else timedelta(0)
    return left > stage_lease(ctx) / 2


def _send(
    ctx: WorkerContext, ref: StageRef, queue: str, *, countdown: float | None = None, retries: int = 0
) -> None:
    try:
        routed = stage_queue(ctx.settings, queue, ref.stage)
        enqueue(
            ctx.sender,
            ctx.settings,
            STAGE_TASK,
            kwargs=ref.as_kwargs(),
            queue=routed,
            countdown=countdown,
            retries=retries,
        )
    except Exception:  # noqa: BLE001  (broker unreachable: the reconciler sends it again)
        log.warning("enqueue of %s failed for %s/%s", ref.stage, ref.kb_id, ref.doc_id)
        hand_to_reconciler(ctx.registry, ref)

"""Runs one pipeline stage for one document: claim, work, record, hand off.

The orchestration only: every decision about the document's record (claim or skip, advance,
release for retry, fail) is made by workers/lifecycle.py, failures are classified by
workers/failures.py, batched stages take peers along through workers/peers.py, and
workers/handover.py writes hand-overs and sends stages.

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
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from typing import NoReturn

from celery.exceptions import SoftTimeLimitExceeded

from shared import logs, tracing
from shared.errors import ErrorCode, RaglineError, TransientError
from shared.ingest import StageRef
from shared.models import utcnow
from shared.registry import Conflict, Versioned
from workers import lifecycle, metrics, peers
from workers.context import WorkerContext
from workers.failures import classify, is_outage, outage_countdown, retry_countdown
from workers.handover import (
    ClaimedStage,
    drop_artifacts,
    drop_superseded,
    drop_version,
    hand_over,
    send,
    stage_input,
    write_stage_times,
)
from workers.lease import LeaseKeeper, lifecycle_policy, stage_lease
from workers.stages.base import StageResult, Stages, TurnEnded

log = logging.getLogger(__name__)


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


def _claim(
    ctx: WorkerContext, ref: StageRef, skipped: Callable[[str], None] | None = None
) -> Versioned | None:
    """Take the document for this stage, or None when this delivery is stale or a duplicate (then
    `skipped` hears why)."""
    current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
    decision = lifecycle.claim(
        current.doc if current else None, ref, lifecycle_policy(ctx.settings), utcnow()
    )
    why: str
    if current is None or isinstance(decision, lifecycle.Skip):
        why = decision.why if isinstance(decision, lifecycle.Skip) else "deleted"
    elif isinstance(decision, lifecycle.GiveUp):
        ctx.registry.replace_doc(current, decision.doc)
        metrics.document_failed(ref.stage.value, ErrorCode.RETRIES_EXHAUSTED.value)
        drop_artifacts(ctx, ref, current.doc)
        why = "started too many times: failed"
    else:
        try:
            return ctx.registry.replace_doc(current, decision.doc)
        except Conflict:
            why = "claimed"  # by another worker, first
    if skipped is not None:
        skipped(why)
    return None


# Skips that are the pipeline's routine: a batch took the document along as a peer (its own task
# comes later and finds it moved on), or a duplicate delivery came while another held it. Logged
# at info they were most of a bulk load's worker log.
_ROUTINE_SKIPS = frozenset({"moved on", "claimed"})


def _log_skip(ref: StageRef, why: str) -> None:
    level = logging.DEBUG if why in _ROUTINE_SKIPS else logging.INFO
    log.log(level, "skip %s for %s/%s v%d: %s", ref.stage, ref.kb_id, ref.doc_id, ref.content_version, why)


def _waits(ctx: WorkerContext, ref: StageRef) -> bool:
    """Whether the document still waits at `ref`'s stage for a delivery to take it."""
    current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
    if current is None:
        return False
    decision = lifecycle.claim(current.doc, ref, lifecycle_policy(ctx.settings), utcnow())
    return not isinstance(decision, lifecycle.Skip)


def run_stage(ctx: WorkerContext, ref: StageRef, stages: Stages, retries_done: int) -> None:
    """Run the stage in `ref` for its document, then hand the document to the next stage.

    A batched stage also takes other documents waiting at it (embedding many small documents in
    one model batch); their own queued tasks then find them moved on and do nothing. The stages
    that follow run here too while they chain (see the module docstring), for half the task's
    soft time limit at most: a chain never outlives the limit a single stage has. The task reads
    each knowledge base once, so all its stages see the same settings.
    """
    try:
        with ctx.registry.kb_snapshots():
            _run_task(ctx, ref, stages, retries_done)
    finally:
        write_stage_times(ctx)


def _run_task(ctx: WorkerContext, ref: StageRef, stages: Stages, retries_done: int) -> None:
    claimed = _claim(ctx, ref, lambda why: _log_skip(ref, why))
    if claimed is None:
        return
    items = [ClaimedStage(ref, claimed)]
    traces: dict[StageRef, dict[str, str]] = {}
    # A retried document runs alone: its batch may have failed for another document's sake.
    if ref.stage in stages.batches and retries_done == 0:
        own_chunks = claimed.doc.chunk_count
        waiting = peers.claim_waiting(
            ctx.redis, ref, own_chunks, lambda peer: _claim(ctx, peer), lambda peer: _waits(ctx, peer), traces
        )
        items += [ClaimedStage(peer_ref, peer) for peer_ref, peer in waiting]
        if waiting:
            log.info(
                "%s for %s/%s takes %d waiting documents along (%d chunks with its own %d)",
                ref.stage,
                ref.kb_id,
                ref.doc_id,
                len(waiting),
                own_chunks + sum(peer.doc.chunk_count for _, peer in waiting),
                own_chunks,
            )
    chain_until = time.monotonic() + ctx.settings.celery.soft_time_limit_s / 2
    pending = deque(_run_claimed(ctx, items, stages, retries_done, traces, chain_until))
    while pending:
        # Documents a batch handed on together stay together where the next stage batches too.
        group = [pending.popleft()]
        if group[0].ref.stage in stages.batches:
            group += [i for i in pending if i.ref.stage == group[0].ref.stage]
            pending = deque(i for i in pending if i.ref.stage != group[0].ref.stage)
        pending.extend(run_chained(ctx, group, stages, chain_until))


def run_chained(
    ctx: WorkerContext, items: list[ClaimedStage], stages: Stages, chain_until: float
) -> list[ClaimedStage]:
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
            send(ctx, ref, queue, countdown=retry.countdown, retries=1 if retry.counted else 0)
        except Exception as error:
            if not is_outage(error):
                # Left claimed: the reconciler sends the stage again when its lease runs out.
                log.exception("chained %s failed for %s/%s", ref.stage, ref.kb_id, ref.doc_id)
            else:
                send(ctx, ref, queue, countdown=outage_countdown())
    return []


def _run_claimed(
    ctx: WorkerContext,
    items: list[ClaimedStage],
    stages: Stages,
    retries_done: int,
    traces: dict[StageRef, dict[str, str]],
    chain_until: float,
) -> list[ClaimedStage]:
    """Run one stage for claimed documents (the first is the task's own); returns those chained on."""
    ref = items[0].ref
    fn, batch_fn = stages.functions[ref.stage], stages.batches.get(ref.stage)
    started = time.perf_counter()
    produced: list[StageResult | RaglineError] | Exception
    with (
        LeaseKeeper(ctx.registry, [i.claim for i in items], stage_lease(ctx.settings)) as keeper,
        contextlib.ExitStack() as files,
    ):
        try:
            inputs = [(i.claim.doc, stage_input(ctx, i, files)) for i in items]
            produced = batch_fn(ctx, inputs) if batch_fn is not None else [fn(ctx, *inputs[0])]
        except Exception as error:  # noqa: BLE001  (every failure is classified; none escapes untyped)
            produced = error
    items = [replace(i, claim=c) for i, c in zip(items, keeper.claims(), strict=True)]
    if isinstance(produced, TurnEnded):
        _next_turn(ctx, items, retries_done, produced)
        return []
    if isinstance(produced, Exception):
        failure = classify(ref, produced)
        alone = False
        if len(items) > 1 and not failure.retryable:
            # A batch that failed as a whole (its time limit, a crash in the model) says nothing
            # of which document caused it: one tenant's huge document would fail every other
            # tenant's in its batch. Each runs again alone, where a failure is its own.
            failure, alone = TransientError(f"{failure.message} in a batch", code=failure.code), True
        outcome = lifecycle.failure_outcome(failure, retries_done, ctx.settings.celery.max_retries)
        for _ in items:
            metrics.stage_observed(ref.stage.value, outcome, (time.perf_counter() - started) / len(items))
        if failure.retryable:
            _retry_or_fail(ctx, [(i.ref, i.claim) for i in items], failure, retries_done, peers_alone=alone)
        for item in items:
            _finish_failed(ctx, item.ref, failure, item.claim)
        return []
    elapsed = time.perf_counter() - started
    weights = [max(1, i.claim.doc.chunk_count) for i in items]
    chained: list[ClaimedStage] = []
    for item, result, weight in zip(items, produced, weights, strict=True):
        if isinstance(result, RaglineError):
            metrics.stage_observed(ref.stage.value, "failed", elapsed * weight / sum(weights))
            _finish_failed(ctx, item.ref, result, item.claim)
            continue
        may_chain = time.monotonic() < chain_until
        # A batch's peers log under their own ids and record their share in their own traces.
        mine = {"tenant": item.ref.tenant_id, "kb": item.ref.kb_id, "doc_id": item.ref.doc_id}
        with logs.bound(**mine), peers.peer_span(traces, item.ref):
            share = elapsed * weight / sum(weights)
            try:
                following = hand_over(ctx, item.ref, item.claim, result, share, stages if may_chain else None)
            except Exception as error:
                if is_outage(error) or isinstance(error, SoftTimeLimitExceeded):
                    raise  # an outage is waited out (hand_over sent what it could); the task's time is up
                _hand_over_failed(ctx, item, classify(item.ref, error))
                continue
        if following is not None:
            chained.append(following)
    return chained


def _hand_over_failed(ctx: WorkerContext, item: ClaimedStage, failure: RaglineError) -> None:
    """A stage's result that could not be handed on (its artifact not written, an unexpected error
    in the write or after it): the error is recorded on the document, which stays claimed at its
    stage, so the reconciler sends the stage again when the lease runs out. That claim counts
    towards the attempt limit, so a document that keeps failing so ends `RETRIES_EXHAUSTED` naming
    this error, not an unexplained one. A failure that would not be retried goes the same way: an
    error after the stage's work says little of the document itself. The write is fenced by the
    claim: where the hand-over's own write landed before the error, the record has moved on and is
    left as it is. The other documents of the batch are handed on all the same."""
    try:
        ctx.registry.replace_doc(item.claim, lifecycle.note_error(item.claim.doc, item.ref.stage, failure))
    except Conflict:  # moved on by the hand-over itself, or superseded: nothing of ours to record
        drop_superseded(ctx, item.ref, item.claim)


def _retry_or_fail(
    ctx: WorkerContext,
    items: list[tuple[StageRef, Versioned]],
    error: RaglineError,
    retries_done: int,
    *,
    peers_alone: bool = False,
) -> NoReturn:
    """Release every claimed document; retry the task's own document later, or fail it for good.

    An outage is waited out without limit: the document is fine, its backing service is not.
    `peers_alone`: the peers' tasks count as retried, so that each runs alone (see `_run_task`).
    """
    (own_ref, own), others = items[0], items[1:]
    countdown = retry_countdown(error, retries_done, ctx.settings.celery.retry_backoff_max_s)
    plan = lifecycle.plan_retry(error, retries_done, countdown, lifecycle_policy(ctx.settings), utcnow())
    # The task's resend covers its own document: should this process die before sending it, the
    # document waits one stage lease past the countdown for the reconciler, not the queue lease.
    _release(ctx, own_ref, own, error, plan.own_lease_until)
    for peer_ref, peer in others:
        # A peer's own task may have come and gone while this one held it: send it again, even
        # when the release fails (it may have landed all the same; if not, the claim's lease runs
        # out and the reconciler sends it).
        try:
            _release(ctx, peer_ref, peer, error, plan.peer_lease_until)
        finally:
            send(ctx, peer_ref, peer.doc.queue, retries=1 if peers_alone else 0)
    if plan.fail_with is not None:
        _finish_failed(ctx, own_ref, plan.fail_with)
        raise Done
    metrics.retried(own_ref.stage.value, error.code.value)
    raise Retry(plan.countdown, counted=plan.counted)


def _next_turn(ctx: WorkerContext, items: list[ClaimedStage], retries_done: int, turn: TurnEnded) -> None:
    """Release the documents whose stage's turn ran out and send the stage again, each to the back
    of its queue: the process is free for whatever waits meanwhile (interactive documents first).

    The send covers each document, as a retry's does; should it be lost, the queue lease runs out
    and the reconciler sends the stage. Nothing is counted: the documents stay at their stage,
    without error, with their retries as they were.
    """
    ref = items[0].ref
    log.info(
        "%s for %s/%s yields its process after its turn (%s); sent again",
        ref.stage,
        ref.kb_id,
        ref.doc_id,
        turn,
    )
    until = utcnow() + lifecycle_policy(ctx.settings).queue_lease
    for position, item in enumerate(items):
        try:
            doc = item.claim.doc
            tally = turn.tallies.get((doc.tenant_id, doc.kb_id, doc.doc_id))
            ctx.registry.replace_doc(item.claim, lifecycle.release_turn(doc, until, ref.stage, tally))
        except Conflict:  # superseded meanwhile: nothing of ours to release
            drop_superseded(ctx, item.ref, item.claim)
        finally:
            send(ctx, item.ref, item.claim.doc.queue, retries=retries_done if position == 0 else 0)


def _release(
    ctx: WorkerContext, ref: StageRef, claimed: Versioned, error: RaglineError, until: datetime
) -> None:
    released = lifecycle.release_for_retry(claimed.doc, ref.stage, error, until)
    try:
        ctx.registry.replace_doc(claimed, released)
    except Conflict:  # superseded meanwhile: nothing of ours to release
        drop_superseded(ctx, ref, claimed)


def _finish_failed(
    ctx: WorkerContext, ref: StageRef, error: RaglineError, claimed: Versioned | None = None
) -> None:
    """Fail the document at `ref`'s stage for good.

    `claimed` is this process's claim, where it still holds one: its record in memory also has
    what chained hand-overs left unwritten (the timings and transitions of the stages since the
    last write), which a record read back would lose. Once another write has moved the record on,
    the stored one is failed instead, if it is still this version of this document: a record
    created anew meanwhile (its KB deleted and created again, the file uploaded again) has the same
    id and version, and is another document.
    """
    current = claimed
    created_at = claimed.doc.created_at if claimed is not None else None
    for _ in range(5):
        if current is None:
            current = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
        if (
            current is None
            or lifecycle.superseded(current.doc, ref.content_version)
            or (created_at is not None and current.doc.created_at != created_at)
        ):
            if claimed is not None:  # what this version of this record left goes with it
                drop_version(ctx, ref, claimed.doc)
            return
        try:
            ctx.registry.replace_doc(current, lifecycle.fail(current.doc, ref.stage, error, utcnow()))
            metrics.document_failed(ref.stage.value, error.code.value)
            log.warning("document %s/%s failed at %s: %s", ref.kb_id, ref.doc_id, ref.stage, error)
            drop_artifacts(ctx, ref, current.doc)
            return
        except Conflict:
            current = None

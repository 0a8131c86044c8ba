"""Hand-overs between stages: artifacts, the fenced write that moves a document on, and sends.

A stage's output is an artifact keyed by (document record, version, stage), so a redelivered
stage overwrites rather than duplicates, and a stage of a record deleted meanwhile never meets the
artifacts of a new record of the same id (`blobs.record_stamp`). The hand-over writes the record
`lifecycle.advance` decided (fenced by the claim's seq_no) and sends the next stage's task, or,
when the next stage chains (goes to the queue this one came from), returns it to this task,
claimed with its input; into a light stage, while the claim's lease has more than half left,
that hand-over is not written at all: the chain's next write records it (see workers/runner.py).
A send the broker refuses hands the document to the reconciler.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery.exceptions import Retry as CeleryRetry

from shared import blobs, text_caches, tracing
from shared.errors import TransientError
from shared.ingest import STAGE_TASK, StageRef, hand_to_reconciler
from shared.models import PIPELINE, Document, Stage, utcnow
from shared.queue import enqueue, stage_queue
from shared.registry import Conflict, Registry, Versioned
from workers import lifecycle, metrics, peers
from workers.context import WorkerContext
from workers.failures import is_outage
from workers.lease import lifecycle_policy
from workers.stages.base import BATCHED_STAGES, StageResult, Stages

log = logging.getLogger(__name__)

UNREAD = object()  # a stage input still in the blob store (the stage before ran in another task)


@dataclass(frozen=True)
class ClaimedStage:
    """A document claimed for a stage; `artifact` is its input when the stage before ran here."""

    ref: StageRef
    claim: Versioned
    artifact: Any = UNREAD
    trace: dict[str, str] | None = None  # the parent of a chained stage's span


def drop_artifacts(ctx: WorkerContext, ref: StageRef, doc: Document, *, older: bool = True) -> None:
    """Remove what the stages of this version (and, with `older`, of every version before it)
    handed on: the parsed text and the chunks before redaction among it. Kept by a version that
    failed or was superseded, they were raw document text left in the blob store."""
    first = 1 if older else ref.content_version
    versions = range(first, ref.content_version + 1)
    ctx.blobs.drop_artifacts(blobs.version_artifact_keys(doc, versions))


def drop_superseded(ctx: WorkerContext, ref: StageRef, claimed: Versioned) -> Versioned | None:
    """After a write fenced by `claimed` conflicted: the record as it is now. When that is no
    longer this version of this record (gone, created anew after its KB was deleted and created
    again, or at a later version), this version's leavings go (`drop_version`)."""
    now = ctx.registry.get_doc(ref.tenant_id, ref.kb_id, ref.doc_id)
    replaced = now is not None and now.doc.created_at != claimed.doc.created_at
    if replaced or lifecycle.superseded(now.doc if now else None, ref.content_version):
        drop_version(ctx, ref, claimed.doc)
    return now


def drop_version(ctx: WorkerContext, ref: StageRef, doc: Document) -> None:
    """What a version superseded or deleted while a stage ran handed on, and the cache entries it
    used: nothing else would ever read or remove the one, which is the document's raw text, and
    the other was written (or listed) after the delete's own sweep of the caches."""
    drop_artifacts(ctx, ref, doc, older=False)
    text_caches.forget_lists(ctx.redis, [text_caches.listing(doc)])


def stage_input(ctx: WorkerContext, item: ClaimedStage, files: contextlib.ExitStack) -> Any:
    """The stage's input: handed on in this task, or as the stage before left it in the blob store
    (fetch: the document's URL; parse: the document's bytes)."""
    if item.artifact is not UNREAD:
        return item.artifact
    if item.ref.stage == Stage.FETCH:
        return item.claim.doc.url
    if item.ref.stage == Stage.PARSE:
        # A file of this host (the store may be a bucket), kept until the stage is done with it.
        return files.enter_context(ctx.blobs.local_file(item.claim.doc.content_hash))
    previous = PIPELINE[PIPELINE.index(item.ref.stage) - 1]
    doc, version = item.claim.doc, item.ref.content_version
    try:
        return ctx.blobs.get_artifact(blobs.artifact_key(doc, version, previous.value))
    except FileNotFoundError:
        return ctx.blobs.get_artifact(blobs.unstamped_artifact_key(doc, version, previous.value))


def runs_here(ctx: WorkerContext, doc: Document, stage: Stage, nxt: Stage, stages: Stages | None) -> bool:
    """Whether this task runs `nxt` itself: a chained stage that goes to the queue `stage` came from."""
    if stages is None or nxt not in stages.chained:
        return False
    return stage_queue(ctx.settings, doc.queue, nxt) == stage_queue(ctx.settings, doc.queue, stage)


def send(
    ctx: WorkerContext, ref: StageRef, queue: str, *, countdown: float | None = None, retries: int = 0
) -> None:
    """Send `ref`'s stage task; with the broker unreachable, the reconciler sends it instead."""
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


def resend(ref: StageRef, send_again: Callable[[], object], registry: Callable[[], Registry]) -> None:
    """Send the stage again; with the broker down, expire the document's queue lease instead.

    The stage released the document with a queue lease (30 min) for this send to cover; a lost
    send left it unsent for that long (a Redis stop mid-load met it in the fault tests). The
    reconciler's next round sends it once the broker is back. `registry` is called only then:
    building it may be what failed.
    """
    try:
        send_again()
    except CeleryRetry:
        raise  # what Task.retry raises once the retry is sent: Celery's own signal, not a failure
    except Exception:  # noqa: BLE001  (broker unreachable, any error type)
        log.warning(
            "resending %s failed for %s/%s; handed to the reconciler", ref.stage, ref.kb_id, ref.doc_id
        )
        hand_to_reconciler(registry(), ref)


def write_stage_times(ctx: WorkerContext) -> None:
    with contextlib.suppress(Exception):  # metrics never fail a document
        ctx.stage_times.flush(ctx.redis)


def _write(ctx: WorkerContext, claimed: Versioned, doc: Document, pin: str | None) -> Versioned:
    """The fenced write of a hand-over; with `pin`, the bytes it names are held until it lands."""
    if pin is None:
        return ctx.registry.replace_doc(claimed, doc)
    with ctx.blobs.pinned(pin):
        if not ctx.blobs.exists(pin):  # a delete of the same bytes elsewhere removed them just now
            raise TransientError("the fetched bytes met a delete of the same content; fetching again")
        return ctx.registry.replace_doc(claimed, doc)


def hand_over(
    ctx: WorkerContext,
    ref: StageRef,
    claimed: Versioned,
    result: StageResult,
    elapsed: float,
    stages: Stages | None = None,
) -> ClaimedStage | None:
    """Record the stage's result and hand the document on: to the next stage's task, or (when it
    chains, given `stages`) to this task, returned claimed with its input."""
    nxt = lifecycle.next_stage(ref.stage, result)
    if nxt is not None:
        key = blobs.artifact_key(claimed.doc, ref.content_version, ref.stage.value)
        ctx.blobs.put_artifact(key, result.artifact)
    # A document moved to another queue (workers/stages/chunk.py) is sent there, never chained.
    moves = result.updates.get("queue", claimed.doc.queue) != claimed.doc.queue
    chains = nxt is not None and not moves and runs_here(ctx, claimed.doc, ref.stage, nxt, stages)
    moved = lifecycle.advance(
        claimed.doc, ref.stage, result, elapsed, lifecycle_policy(ctx.settings), utcnow(), chains=chains
    )
    ctx.stage_times.observe(ref.stage.value, elapsed)
    metrics.stage_observed(ref.stage.value, "ok", elapsed)
    doc = moved.doc
    next_ref = StageRef(ref.tenant_id, ref.kb_id, ref.doc_id, ref.content_version, nxt) if nxt else None
    if moved.deferred and next_ref is not None:
        # The registry still holds this task's claim on the document, so the next stage's write
        # (its hand-over, a lease renewal, a release or a failure) records this one as well, and
        # its seq_no still fences it. A process that dies before then leaves the document claimed
        # at an earlier stage: the reconciler sends that stage again once the lease runs out, and
        # its input is in the blob store (the artifact above is written all the same).
        return ClaimedStage(
            next_ref, Versioned(doc, claimed.seq_no, claimed.primary_term), result.artifact, tracing.carrier()
        )
    if not moved.chains:
        # Observations are written together where a document leaves this task (sent on, or
        # ready), not one round trip for each stage: whoever sees it at its next stage or ready
        # sees its stages so far counted. The task writes what is left as it ends (runner.py).
        write_stage_times(ctx)
    try:
        written = _write(ctx, claimed, doc, result.pin)
    except Conflict:
        # Superseded while working (a new version, a delete, or a new record of the same id after
        # its KB was deleted and created again). The newer state wins; the artifacts written above
        # belong to this version of this record only and are never read by another. (A conflict
        # within this version, a resend by the reconciler, leaves them to that run.)
        log.info("document %s/%s changed during %s; dropping this result", ref.kb_id, ref.doc_id, ref.stage)
        if drop_superseded(ctx, ref, claimed) is None and result.undo is not None:
            result.undo()
        return None
    except Exception as error:
        if next_ref is not None and is_outage(error):
            # A node that stops mid-request can apply the hand-over and lose only the reply. Had
            # it landed, nothing would send the next stage: the document would sit unclaimed at
            # it for its whole queue lease. So send it anyway; if the write did not land, that
            # task finds the document still at this stage and drops itself. (A chained hand-over
            # that landed holds a stage lease: that task drops itself too, and the reconciler
            # sends the stage when the lease runs out.)
            send(ctx, next_ref, doc.queue)
        raise
    if result.after is not None:
        result.after()
    if next_ref is None:
        metrics.document_ready()
        log.info("document %s/%s ready: %d chunks", ref.kb_id, ref.doc_id, doc.chunk_count)
        drop_artifacts(ctx, ref, doc)  # and those of versions superseded before they finished
        return None
    if moved.chains:
        return ClaimedStage(next_ref, written, result.artifact, tracing.carrier())
    if next_ref.stage in BATCHED_STAGES:
        peers.announce(ctx.redis, next_ref, doc.chunk_count)
    send(ctx, next_ref, doc.queue)
    return None

"""A document's life through the pipeline as pure decisions: no registry, broker, Redis or clock.

Each function takes the document's record as read (and the time, passed in) and returns the
record to write, or a decision saying what the runner must do; the runner does the I/O. The
states: queued, then one status per stage (`STAGE_STATUS`), then ready, or failed. A version
starts at its entry stage (fetch for a URL, parse for bytes: `Document.stage` says which, parse
when unset); a stage may also end the pipeline early (a URL fetched again brought the bytes of
the ready version: nothing to redo). A stage is
claimed (claimed_by, a stage lease, attempts counted), run, and handed over to the next stage
(unclaimed with a queue lease, or, when the task chains, claimed by it); a failure either
releases the document for a retry or fails it. Fencing is by version: a delivery for another
content version, for a stage the record is not at, or meeting a live lease does nothing. See
docs/architecture.md for the pipeline and its failure modes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from shared.errors import ErrorCode, OutageError, RaglineError
from shared.models import (
    ENTRY_STAGES,
    PIPELINE,
    STAGE_STATUS,
    DocStatus,
    Document,
    ErrorInfo,
    Stage,
    entry_stage,
)
from workers.stages.base import BATCHED_STAGES, TURNS, StageResult, TurnTally

if TYPE_CHECKING:
    from shared.ingest import StageRef

MAX_TRANSITIONS = 64


@dataclass(frozen=True)
class Policy:
    """The limits the decisions follow, read from the settings once by the runner."""

    worker: str  # who claims: this process
    stage_lease: timedelta
    queue_lease: timedelta
    max_retries: int  # counted retries of a task; a stage may be started one time more

    @property
    def attempt_limit(self) -> int:
        return self.max_retries + 1


def status_before(stage: Stage) -> DocStatus:
    """The status a document waits in for `stage` before its claim moves it to the stage's own:
    queued for an entry stage, else the stage's own, set by the hand-over (a parse after a fetch
    waits in `parsing` too)."""
    return DocStatus.QUEUED if stage in ENTRY_STAGES else STAGE_STATUS[stage]


def next_stage(stage: Stage, result: StageResult | None = None) -> Stage | None:
    """The stage after `stage`; None when it was the last, or its `result` ended the pipeline."""
    position = PIPELINE.index(stage)
    if (result is not None and result.finished) or position + 1 == len(PIPELINE):
        return None
    return PIPELINE[position + 1]


def superseded(doc: Document | None, version: int) -> bool:
    """Whether a newer version (or a delete) replaced the version a stage ran for."""
    return doc is None or doc.content_version != version


def _moved(doc: Document, status: DocStatus, now: datetime) -> None:
    doc.status = status
    doc.transitions = [*doc.transitions, {"status": status.value, "at": now.isoformat()}][-MAX_TRANSITIONS:]


@dataclass(frozen=True)
class Skip:
    """Do nothing: the delivery is stale or a duplicate."""

    why: str


@dataclass(frozen=True)
class Take:
    """Write `doc`, fenced by the read's seq_no: a conflict means another worker took it first."""

    doc: Document


@dataclass(frozen=True)
class GiveUp:
    """Write the failed `doc` and drop its artifacts: the stage was started too many times."""

    doc: Document


def claim(doc: Document | None, ref: StageRef, policy: Policy, now: datetime) -> Skip | Take | GiveUp:
    """Take the document for `ref`'s stage, or say why this delivery does nothing."""
    if doc is None:
        return Skip("deleted")
    if doc.content_version != ref.content_version:
        return Skip("superseded")  # by a newer version, whose own pipeline runs
    if doc.status not in (status_before(ref.stage), STAGE_STATUS[ref.stage]):
        return Skip("moved on")  # already past this stage, failed or deleted
    if doc.status == DocStatus.QUEUED and ref.stage != entry_stage(doc):
        return Skip("not its entry stage")  # a URL's version has no bytes to parse before its fetch
    if doc.claimed_by is not None and doc.lease_until is not None and doc.lease_until > now:
        return Skip("claimed")  # another delivery holds a live lease
    taken = doc.model_copy()
    if taken.stage != ref.stage:
        taken.attempts = 0
    taken.attempts += 1
    if taken.attempts > policy.attempt_limit:
        exhausted = RaglineError(
            "the stage was started too many times without finishing", code=ErrorCode.RETRIES_EXHAUSTED
        )
        return GiveUp(fail(taken, ref.stage, exhausted, now, previous=taken.error))
    if taken.status != STAGE_STATUS[ref.stage]:
        _moved(taken, STAGE_STATUS[ref.stage], now)
    taken.stage = ref.stage
    taken.claimed_by = policy.worker
    taken.lease_until = now + policy.stage_lease
    return Take(taken)


def fail(
    doc: Document, stage: Stage, error: RaglineError, now: datetime, previous: ErrorInfo | None = None
) -> Document:
    """The document failed for good at `stage`; `previous` is the error it last retried on."""
    message = error.message
    if previous is not None and error.code == ErrorCode.RETRIES_EXHAUSTED:
        message = f"{message}; last error: {previous.code}: {previous.message}"
    failed = doc.model_copy()
    failed.error = ErrorInfo(code=error.code.value, stage=stage.value, message=message, retryable=False)
    _moved(failed, DocStatus.FAILED, now)
    failed.claimed_by = None
    failed.lease_until = None
    return failed


def release_for_retry(doc: Document, stage: Stage, error: RaglineError, lease_until: datetime) -> Document:
    """The document released with its retryable error, for a resend due before `lease_until`."""
    released = doc.model_copy()
    released.error = ErrorInfo(
        code=error.code.value, stage=stage.value, message=error.message, retryable=True
    )
    # A clean release is not a lost claim: only claims whose worker died count towards the limit.
    released.attempts = max(0, released.attempts - 1)
    released.claimed_by = None
    released.lease_until = lease_until
    return released


def note_error(doc: Document, stage: Stage, error: RaglineError) -> Document:
    """The claimed document with the retryable error its stage met after its work, still claimed:
    the reconciler sends the stage again when the lease runs out, and that claim counts."""
    noted = doc.model_copy()
    noted.error = ErrorInfo(code=error.code.value, stage=stage.value, message=error.message, retryable=True)
    return noted


def release_turn(doc: Document, lease_until: datetime, stage: Stage, tally: TurnTally | None) -> Document:
    """The document released between two turns of its stage, for a resend due before `lease_until`:
    it stays at the stage with no error, as nothing failed. Its progress moves by the share of the
    stage done, and the embed stage's stats keep what its turns encoded (its last turn counts it)."""
    released = doc.model_copy()
    released.attempts = max(0, released.attempts - 1)  # a turn is not a lost claim either
    released.claimed_by = None
    released.lease_until = lease_until
    if tally is None or tally.total == 0:
        return released
    share = (PIPELINE.index(stage) + tally.done / tally.total) / len(PIPELINE)
    released.progress = max(released.progress, round(share, 4))
    if stage != Stage.EMBED:  # the turns' stats are the embed stage's (workers/stages/embed.py)
        return released
    turns = doc.stats.get(TURNS, {})
    if turns.get("version") != doc.content_version:
        turns = {"version": doc.content_version, "count": 0, "embedded": 0}
    released.stats = {
        **doc.stats,
        TURNS: {**turns, "count": turns["count"] + 1, "embedded": turns["embedded"] + tally.encoded},
    }
    return released


@dataclass(frozen=True)
class RetryPlan:
    """What a retryable failure does: release every document, then retry the task's own later
    (uncounted for an outage) or fail it with `fail_with` once its retries are used up."""

    countdown: float
    counted: bool
    own_lease_until: datetime  # the resend covers it; a process that dies leaves it to the reconciler
    peer_lease_until: datetime  # a peer is sent again at once
    fail_with: RaglineError | None


def plan_retry(
    failure: RaglineError, retries_done: int, countdown: float, policy: Policy, now: datetime
) -> RetryPlan:
    """The retry of a retryable `failure`; an outage is waited out without limit."""
    outage = isinstance(failure, OutageError)
    exhausted = not outage and retries_done >= policy.max_retries
    return RetryPlan(
        countdown=countdown,
        counted=not outage,
        own_lease_until=now + timedelta(seconds=countdown) + policy.stage_lease,
        peer_lease_until=now + policy.queue_lease,
        fail_with=RaglineError(failure.message, code=ErrorCode.RETRIES_EXHAUSTED) if exhausted else None,
    )


def failure_outcome(failure: RaglineError, retries_done: int, max_retries: int) -> str:
    """The stage metric's outcome of a failed run: "retry" or "failed"."""
    retrying = isinstance(failure, OutageError) or retries_done < max_retries
    return "retry" if failure.retryable and retrying else "failed"


def lease_outlasts_half(doc: Document, policy: Policy, now: datetime) -> bool:
    """Whether the claim's lease has more than half a stage lease left: a chained hand-over that
    is not written does not renew it, and the next stage's heartbeat starts only a quarter lease
    in."""
    left = (doc.lease_until - now) if doc.lease_until is not None else timedelta(0)
    return left > policy.stage_lease / 2


@dataclass(frozen=True)
class HandOver:
    """The document as a finished stage leaves it: at `next` (None: ready), claimed by this task
    when it `chains`; `deferred`: not written now, the next write of the chain records it."""

    doc: Document
    next: Stage | None
    chains: bool
    deferred: bool


def advance(
    doc: Document,
    stage: Stage,
    result: StageResult,
    elapsed: float,
    policy: Policy,
    now: datetime,
    *,
    chains: bool,
) -> HandOver:
    """Record the stage's result and hand the document on; `chains`: this task runs the next
    stage itself (a hand-over that is then also that stage's claim). A `finished` result makes
    the document ready at once."""
    nxt = next_stage(stage, result)
    chain = nxt is not None and chains
    # Into store the hand-over is written: a process that dies mid-store then leaves the document
    # at store (whose input is the embedded chunks) instead of at embed, and the store of a long
    # document, hundreds of chunks in bulk, is a stage worth seeing.
    deferred = (
        chain
        and nxt not in BATCHED_STAGES
        and result.after is None
        and result.undo is None
        and result.pin is None
        and lease_outlasts_half(doc, policy, now)
    )
    moved = doc.model_copy()
    for name, value in result.updates.items():
        setattr(moved, name, value)
    moved.timings = {**moved.timings, stage.value: round(elapsed, 4)}
    moved.progress = max(moved.progress, (PIPELINE.index(stage) + 1) / len(PIPELINE))
    moved.error = None
    moved.claimed_by = None
    if nxt is None:
        _moved(moved, DocStatus.READY, now)
        moved.stage = None
        moved.lease_until = None
        moved.progress = 1.0
        return HandOver(moved, None, chains=False, deferred=False)
    _moved(moved, STAGE_STATUS[nxt], now)
    moved.stage = nxt
    moved.attempts = 0
    moved.lease_until = now + policy.queue_lease
    if chain:  # the hand-over is also the next stage's claim, as `claim` would write it
        moved.attempts = 1
        moved.claimed_by = policy.worker
        moved.lease_until = doc.lease_until if deferred else now + policy.stage_lease
    return HandOver(moved, nxt, chains=chain, deferred=deferred)

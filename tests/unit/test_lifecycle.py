"""Every transition of a document's lifecycle, decided without a registry, broker or clock."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from shared.errors import ErrorCode, OutageError, PermanentError, RaglineError, TransientError
from shared.ingest import StageRef
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
from workers import lifecycle
from workers.lifecycle import GiveUp, HandOver, Policy, Skip, Take
from workers.stages.base import BATCHED_STAGES, TURNS, StageResult, TurnTally

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
POLICY = Policy(
    worker="me:1", stage_lease=timedelta(seconds=60), queue_lease=timedelta(minutes=30), max_retries=3
)
LAST = PIPELINE[-1]
NOT_LAST = PIPELINE[:-1]
# Stages a hand-over moves a document into (never entered from `queued`).
HANDED_TO = [stage for stage in PIPELINE if stage not in ENTRY_STAGES]


def _doc(**fields: object) -> Document:
    base: dict[str, object] = {
        "tenant_id": "t",
        "kb_id": "kb",
        "doc_id": "d",
        "content_hash": "h",
        "file_size": 1,
    }
    return Document.model_validate({**base, **fields})


def _ref(stage: Stage, version: int = 1) -> StageRef:
    return StageRef("t", "kb", "d", version, stage)


def _waiting(at: Stage, **fields: object) -> Document:
    """A document handed to stage `at`, unclaimed, with a queue lease."""
    waiting: dict[str, object] = {
        "status": lifecycle.status_before(at),
        "stage": at,
        "lease_until": NOW + POLICY.queue_lease,
    }
    return _doc(**{**waiting, **fields})


def _claimed(stage: Stage, lease_left: timedelta = timedelta(seconds=60), **fields: object) -> Document:
    """A document this process claimed for `stage`, its lease `lease_left` from now."""
    claimed: dict[str, object] = {
        "status": STAGE_STATUS[stage],
        "stage": stage,
        "attempts": 1,
        "claimed_by": "me:1",
        "lease_until": NOW + lease_left,
    }
    return _doc(**{**claimed, **fields})


def test_the_lifecycle_does_no_io() -> None:
    tree = ast.parse(Path(lifecycle.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    runtime = imported - {"shared.ingest"}  # StageRef, for annotations only
    assert runtime <= {
        "__future__",
        "dataclasses",
        "datetime",
        "typing",
        "shared.errors",
        "shared.models",
        "workers.stages.base",
    }


@pytest.mark.parametrize("stage", PIPELINE)
def test_next_stage_follows_the_pipeline(stage: Stage) -> None:
    position = PIPELINE.index(stage)
    expected = PIPELINE[position + 1] if stage != LAST else None
    assert lifecycle.next_stage(stage) == expected


# Claims


@pytest.mark.parametrize("stage", PIPELINE)
def test_a_waiting_document_is_claimed(stage: Stage) -> None:
    doc = _waiting(stage, attempts=0, stage=None if stage == Stage.PARSE else stage)
    decision = lifecycle.claim(doc, _ref(stage), POLICY, NOW)
    assert isinstance(decision, Take)
    taken = decision.doc
    assert (taken.status, taken.stage, taken.claimed_by) == (STAGE_STATUS[stage], stage, "me:1")
    assert taken.lease_until == NOW + POLICY.stage_lease
    assert taken.attempts == 1
    assert doc.claimed_by is None  # the record read is left as it was


def test_a_claim_from_queued_records_the_transition() -> None:
    decision = lifecycle.claim(_doc(), _ref(Stage.PARSE), POLICY, NOW)
    assert isinstance(decision, Take)
    assert decision.doc.transitions == [{"status": "parsing", "at": NOW.isoformat()}]


@pytest.mark.parametrize("stage", [s for s in NOT_LAST if s not in ENTRY_STAGES])
def test_a_claim_at_the_status_the_hand_over_left_adds_no_transition(stage: Stage) -> None:
    decision = lifecycle.claim(_waiting(stage), _ref(stage), POLICY, NOW)
    assert isinstance(decision, Take)
    assert decision.doc.transitions == []


def test_parse_claims_what_fetch_handed_over_without_a_new_transition() -> None:
    fetched = lifecycle.advance(
        _claimed(Stage.FETCH), Stage.FETCH, StageResult("a"), 1.0, POLICY, NOW, chains=False
    ).doc
    assert (fetched.status, fetched.stage) == (DocStatus.PARSING, Stage.PARSE)
    decision = lifecycle.claim(fetched, _ref(Stage.PARSE), POLICY, NOW)
    assert isinstance(decision, Take)
    assert decision.doc.transitions == fetched.transitions
    assert (decision.doc.attempts, decision.doc.claimed_by) == (1, "me:1")


def test_the_entry_stage_is_fetch_only_for_a_version_at_a_url() -> None:
    assert entry_stage(_doc()) == Stage.PARSE
    assert entry_stage(_doc(stage=Stage.FETCH)) == Stage.FETCH
    assert entry_stage(_doc(stage=Stage.PARSE)) == Stage.PARSE
    assert {lifecycle.status_before(s) for s in ENTRY_STAGES} == {DocStatus.QUEUED}


@pytest.mark.parametrize("entry", sorted(ENTRY_STAGES))
@pytest.mark.parametrize("stage", sorted(ENTRY_STAGES))
def test_a_queued_version_is_claimed_only_by_its_entry_stage(entry: Stage, stage: Stage) -> None:
    # A version by URL has no bytes to parse before its fetch; one of bytes has nothing to fetch.
    queued = _doc(stage=Stage.FETCH if entry == Stage.FETCH else None)
    decision = lifecycle.claim(queued, _ref(stage), POLICY, NOW)
    if stage == entry:
        assert isinstance(decision, Take)
        assert (decision.doc.status, decision.doc.stage) == (STAGE_STATUS[stage], stage)
        assert decision.doc.transitions == [{"status": STAGE_STATUS[stage].value, "at": NOW.isoformat()}]
    else:
        assert decision == Skip("not its entry stage")


@pytest.mark.parametrize("stage", PIPELINE)
def test_a_claim_whose_lease_ran_out_is_taken_again_and_counted(stage: Stage) -> None:
    dead = _claimed(stage, lease_left=-timedelta(seconds=1), claimed_by="dead:2")
    decision = lifecycle.claim(dead, _ref(stage), POLICY, NOW)
    assert isinstance(decision, Take)
    assert (decision.doc.attempts, decision.doc.claimed_by) == (2, "me:1")


@pytest.mark.parametrize("stage", [*HANDED_TO, Stage.PARSE])
def test_attempts_restart_at_a_new_stage(stage: Stage) -> None:
    before = PIPELINE[PIPELINE.index(stage) - 1] if stage not in ENTRY_STAGES else None
    doc = _waiting(stage, stage=before, attempts=3)
    decision = lifecycle.claim(doc, _ref(stage), POLICY, NOW)
    assert isinstance(decision, Take)
    assert decision.doc.attempts == 1


@pytest.mark.parametrize("stage", PIPELINE)
def test_a_stage_started_too_often_fails_with_its_last_error(stage: Stage) -> None:
    last = ErrorInfo(code="UNAVAILABLE", stage=stage.value, message="it stumbled", retryable=True)
    doc = _claimed(stage, lease_left=-timedelta(seconds=1), attempts=POLICY.attempt_limit, error=last)
    decision = lifecycle.claim(doc, _ref(stage), POLICY, NOW)
    assert isinstance(decision, GiveUp)
    failed = decision.doc
    assert failed.status == DocStatus.FAILED
    assert failed.error is not None
    assert (failed.error.code, failed.error.stage, failed.error.retryable) == (
        "RETRIES_EXHAUSTED",
        stage.value,
        False,
    )
    assert failed.error.message.endswith("; last error: UNAVAILABLE: it stumbled")
    assert (failed.claimed_by, failed.lease_until) == (None, None)


def test_a_hand_over_error_is_noted_on_the_claim_and_each_start_after_it_counts() -> None:
    """Unlike a release for retry, which gives its start back, the noted error keeps the claim and
    its count: a stage whose hand-over fails every time ends RETRIES_EXHAUSTED naming the error."""
    error = TransientError("internal error in the parse stage (UnicodeEncodeError)")
    error.code = ErrorCode.INTERNAL
    doc = _claimed(Stage.PARSE, lease_left=timedelta(seconds=30), attempts=1)
    for _ in range(POLICY.attempt_limit):
        noted = lifecycle.note_error(doc, Stage.PARSE, error)
        assert (noted.claimed_by, noted.lease_until, noted.attempts) == (
            doc.claimed_by,
            doc.lease_until,
            doc.attempts,
        )
        assert noted.error is not None
        assert noted.error.retryable
        expired = noted.model_copy(update={"lease_until": NOW - timedelta(seconds=1)})
        decision = lifecycle.claim(expired, _ref(Stage.PARSE), POLICY, NOW)
        if isinstance(decision, GiveUp):
            break
        assert isinstance(decision, Take)
        doc = decision.doc
    assert isinstance(decision, GiveUp)
    assert decision.doc.error is not None
    assert decision.doc.error.code == ErrorCode.RETRIES_EXHAUSTED.value
    assert decision.doc.error.message.endswith(
        "; last error: INTERNAL: internal error in the parse stage (UnicodeEncodeError)"
    )


def test_the_last_allowed_start_is_still_claimed() -> None:
    doc = _claimed(Stage.CHUNK, lease_left=-timedelta(seconds=1), attempts=POLICY.attempt_limit - 1)
    decision = lifecycle.claim(doc, _ref(Stage.CHUNK), POLICY, NOW)
    assert isinstance(decision, Take)
    assert decision.doc.attempts == POLICY.attempt_limit


@pytest.mark.parametrize("stage", PIPELINE)
def test_a_delivery_for_a_deleted_document_does_nothing(stage: Stage) -> None:
    assert lifecycle.claim(None, _ref(stage), POLICY, NOW) == Skip("deleted")


@pytest.mark.parametrize("stage", PIPELINE)
def test_a_delivery_for_another_version_does_nothing(stage: Stage) -> None:
    assert lifecycle.claim(_waiting(stage, content_version=2), _ref(stage, 1), POLICY, NOW) == Skip(
        "superseded"
    )
    assert lifecycle.claim(_waiting(stage, content_version=1), _ref(stage, 2), POLICY, NOW) == Skip(
        "superseded"
    )


@pytest.mark.parametrize("stage", PIPELINE)
@pytest.mark.parametrize("status", list(DocStatus))
def test_a_delivery_for_a_stage_the_record_is_not_at_does_nothing(stage: Stage, status: DocStatus) -> None:
    # A record of the version's kind: one by URL starts at fetch, one of bytes at parse.
    doc = _doc(status=status, stage=Stage.FETCH if stage == Stage.FETCH else None)
    decision = lifecycle.claim(doc, _ref(stage), POLICY, NOW)
    if status in (lifecycle.status_before(stage), STAGE_STATUS[stage]):
        assert isinstance(decision, Take)
    else:
        assert decision == Skip("moved on")


@pytest.mark.parametrize("stage", PIPELINE)
@pytest.mark.parametrize("holder", ["other:2", "me:1"])
def test_a_duplicate_delivery_meets_the_live_lease_and_does_nothing(stage: Stage, holder: str) -> None:
    held = _claimed(stage, lease_left=timedelta(seconds=1), claimed_by=holder)
    assert lifecycle.claim(held, _ref(stage), POLICY, NOW) == Skip("claimed")


def test_a_lease_without_a_holder_does_not_block_a_claim() -> None:
    decision = lifecycle.claim(_waiting(Stage.EMBED), _ref(Stage.EMBED), POLICY, NOW)
    assert isinstance(decision, Take)


# Hand-overs


@pytest.mark.parametrize("stage", NOT_LAST)
def test_a_stage_hands_over_to_the_next_unclaimed(stage: Stage) -> None:
    doc = _claimed(stage, error=ErrorInfo(code="UNAVAILABLE", stage=stage.value, message="x", retryable=True))
    result = StageResult(artifact="a", updates={"chunk_count": 7})
    moved = lifecycle.advance(doc, stage, result, 0.123456, POLICY, NOW, chains=False)
    nxt = PIPELINE[PIPELINE.index(stage) + 1]
    assert moved == HandOver(moved.doc, nxt, chains=False, deferred=False)
    d = moved.doc
    assert (d.status, d.stage, d.attempts, d.claimed_by, d.error) == (STAGE_STATUS[nxt], nxt, 0, None, None)
    assert d.lease_until == NOW + POLICY.queue_lease
    assert d.chunk_count == 7
    assert d.timings == {stage.value: 0.1235}
    assert d.progress == (PIPELINE.index(stage) + 1) / len(PIPELINE)
    assert d.transitions[-1] == {"status": STAGE_STATUS[nxt].value, "at": NOW.isoformat()}
    assert doc.status == STAGE_STATUS[stage]  # the claim's record is left as it was


def test_the_last_stage_finishes_the_document() -> None:
    doc = _claimed(LAST, progress=0.8, timings={"parse": 1.0})
    moved = lifecycle.advance(doc, LAST, StageResult(artifact=None), 2.0, POLICY, NOW, chains=True)
    assert (moved.next, moved.chains, moved.deferred) == (None, False, False)
    d = moved.doc
    assert (d.status, d.stage, d.lease_until, d.claimed_by, d.progress) == (
        DocStatus.READY,
        None,
        None,
        None,
        1.0,
    )
    assert d.timings == {"parse": 1.0, LAST.value: 2.0}
    assert d.transitions[-1]["status"] == DocStatus.READY.value


def test_progress_never_goes_back() -> None:
    moved = lifecycle.advance(
        _claimed(Stage.PARSE, progress=0.5), Stage.PARSE, StageResult("a"), 1, POLICY, NOW, chains=False
    )
    assert moved.doc.progress == 0.5


@pytest.mark.parametrize("stage", NOT_LAST)
@pytest.mark.parametrize("lease_left", [timedelta(seconds=59), timedelta(seconds=29)])
def test_a_chained_hand_over_is_the_next_stages_claim(stage: Stage, lease_left: timedelta) -> None:
    nxt = PIPELINE[PIPELINE.index(stage) + 1]
    doc = _claimed(stage, lease_left=lease_left)
    moved = lifecycle.advance(doc, stage, StageResult("a"), 1.0, POLICY, NOW, chains=True)
    light = nxt not in BATCHED_STAGES
    deferred = light and lease_left > POLICY.stage_lease / 2
    assert (moved.next, moved.chains, moved.deferred) == (nxt, True, deferred)
    d = moved.doc
    assert (d.status, d.stage, d.attempts, d.claimed_by) == (STAGE_STATUS[nxt], nxt, 1, "me:1")
    # Deferred, the claim's lease stands (nothing renews it); written, it is a fresh stage lease.
    assert d.lease_until == (doc.lease_until if deferred else NOW + POLICY.stage_lease)


@pytest.mark.parametrize(
    "result", [StageResult("a", after=lambda: None), StageResult("a", pin="ab" * 32)], ids=["after", "pin"]
)
def test_a_result_with_work_after_its_write_or_bytes_to_hold_is_written_even_when_chained(
    result: StageResult,
) -> None:
    moved = lifecycle.advance(_claimed(Stage.PARSE), Stage.PARSE, result, 1.0, POLICY, NOW, chains=True)
    assert (moved.chains, moved.deferred) == (True, False)


@pytest.mark.parametrize("stage", NOT_LAST)
@pytest.mark.parametrize("chains", [False, True])
def test_a_finished_result_makes_the_document_ready_at_once(stage: Stage, chains: bool) -> None:
    # A URL fetched again that brought the bytes of the ready version: nothing later is redone.
    doc = _claimed(stage, active_generation=3, chunk_count=12, timings={"parse": 1.0})
    result = StageResult(artifact=None, finished=True, updates={"outcome": "unchanged"})
    assert lifecycle.next_stage(stage, result) is None
    moved = lifecycle.advance(doc, stage, result, 0.5, POLICY, NOW, chains=chains)
    assert (moved.next, moved.chains, moved.deferred) == (None, False, False)
    d = moved.doc
    assert (d.status, d.stage, d.claimed_by, d.lease_until, d.progress, d.error) == (
        DocStatus.READY,
        None,
        None,
        None,
        1.0,
        None,
    )
    assert (d.active_generation, d.chunk_count, d.outcome) == (3, 12, "unchanged")
    assert d.timings == {"parse": 1.0, stage.value: 0.5}
    assert d.transitions[-1] == {"status": DocStatus.READY.value, "at": NOW.isoformat()}


def test_half_a_stage_lease_left_is_not_more_than_half() -> None:
    assert not lifecycle.lease_outlasts_half(
        _claimed(Stage.PARSE, lease_left=timedelta(seconds=30)), POLICY, NOW
    )
    assert lifecycle.lease_outlasts_half(_claimed(Stage.PARSE, lease_left=timedelta(seconds=31)), POLICY, NOW)
    assert not lifecycle.lease_outlasts_half(_doc(), POLICY, NOW)


def test_transitions_keep_the_latest() -> None:
    history = [{"status": "parsing", "at": "x"}] * lifecycle.MAX_TRANSITIONS
    moved = lifecycle.advance(
        _claimed(Stage.PARSE, transitions=history),
        Stage.PARSE,
        StageResult("a"),
        1,
        POLICY,
        NOW,
        chains=False,
    )
    assert len(moved.doc.transitions) == lifecycle.MAX_TRANSITIONS
    assert moved.doc.transitions[-1]["status"] == DocStatus.CHUNKING.value


# Failures

CLASSES: list[RaglineError] = [
    OutageError("OpenSearch is down"),
    TransientError("it stumbled"),
    PermanentError("not a document"),
    RaglineError("ran out of time", code=ErrorCode.TIMEOUT),
]


def test_a_turn_moves_progress_through_its_stage_and_keeps_what_it_encoded() -> None:
    """Between turns a document used to sit at its stage's start: a big document's progress stood
    still for all of its embedding, and its stats counted only the last turn's texts."""
    start = PIPELINE.index(Stage.EMBED) / len(PIPELINE)
    doc = _claimed(Stage.EMBED, attempts=1, progress=start, content_version=3, stats={"chunk": {"chunks": 9}})
    first = lifecycle.release_turn(doc, NOW, Stage.EMBED, TurnTally(done=256, total=1024, encoded=200))
    assert (first.claimed_by, first.lease_until, first.attempts) == (None, NOW, 0)
    assert first.progress == pytest.approx(start + 0.25 / len(PIPELINE), abs=1e-4)
    assert first.stats[TURNS] == {"version": 3, "count": 1, "embedded": 200}
    second = lifecycle.release_turn(first, NOW, Stage.EMBED, TurnTally(done=512, total=1024, encoded=256))
    assert second.progress == pytest.approx(start + 0.5 / len(PIPELINE), abs=1e-4)
    assert second.stats == {"chunk": {"chunks": 9}, TURNS: {"version": 3, "count": 2, "embedded": 456}}
    # A tally another version left is not this one's.
    newer = second.model_copy(update={"content_version": 4, "progress": start})
    third = lifecycle.release_turn(newer, NOW, Stage.EMBED, TurnTally(done=10, total=20, encoded=10))
    assert third.stats[TURNS] == {"version": 4, "count": 1, "embedded": 10}
    # Without a tally (a document of another model in the batch), only the claim goes.
    assert lifecycle.release_turn(doc, NOW, Stage.EMBED, None).progress == start


@pytest.mark.parametrize("stage", PIPELINE)
@pytest.mark.parametrize("failure", CLASSES, ids=lambda e: type(e).__name__ + str(e.code))
@pytest.mark.parametrize("retries_done", [0, 2, 3, 9])
def test_every_failure_class_retries_or_fails(stage: Stage, failure: RaglineError, retries_done: int) -> None:
    outcome = lifecycle.failure_outcome(failure, retries_done, POLICY.max_retries)
    if not failure.retryable:
        assert outcome == "failed"
        return
    plan = lifecycle.plan_retry(failure, retries_done, 4.0, POLICY, NOW)
    outage = isinstance(failure, OutageError)
    assert plan.counted == (not outage)
    assert plan.own_lease_until == NOW + timedelta(seconds=4.0) + POLICY.stage_lease
    assert plan.peer_lease_until == NOW + POLICY.queue_lease
    if outage or retries_done < POLICY.max_retries:
        assert outcome == "retry"
        assert plan.fail_with is None
    else:
        assert outcome == "failed"
        assert plan.fail_with is not None
        assert (plan.fail_with.code, plan.fail_with.message) == (ErrorCode.RETRIES_EXHAUSTED, failure.message)


@pytest.mark.parametrize("stage", PIPELINE)
@pytest.mark.parametrize("failure", CLASSES[:2])
def test_a_release_for_retry_gives_back_the_claim_and_its_attempt(
    stage: Stage, failure: RaglineError
) -> None:
    released = lifecycle.release_for_retry(
        _claimed(stage, attempts=2), stage, failure, NOW + timedelta(seconds=9)
    )
    assert (released.claimed_by, released.lease_until, released.attempts) == (
        None,
        NOW + timedelta(seconds=9),
        1,
    )
    assert released.status == STAGE_STATUS[stage]
    assert released.error == ErrorInfo(
        code=failure.code.value, stage=stage.value, message=failure.message, retryable=True
    )
    assert lifecycle.release_for_retry(_claimed(stage, attempts=0), stage, failure, NOW).attempts == 0


@pytest.mark.parametrize("stage", PIPELINE)
@pytest.mark.parametrize("failure", CLASSES, ids=lambda e: type(e).__name__ + str(e.code))
def test_a_failure_fails_the_document_at_its_stage(stage: Stage, failure: RaglineError) -> None:
    failed = lifecycle.fail(_claimed(stage), stage, failure, NOW)
    assert (failed.status, failed.claimed_by, failed.lease_until) == (DocStatus.FAILED, None, None)
    assert failed.error == ErrorInfo(
        code=failure.code.value, stage=stage.value, message=failure.message, retryable=False
    )
    assert failed.transitions[-1] == {"status": "failed", "at": NOW.isoformat()}


def test_only_an_exhausted_failure_names_the_last_error() -> None:
    last = ErrorInfo(code="UNAVAILABLE", stage="parse", message="x", retryable=True)
    plain = lifecycle.fail(_claimed(Stage.PARSE), Stage.PARSE, PermanentError("bad"), NOW, previous=last)
    assert plain.error is not None
    assert plain.error.message == "bad"


@pytest.mark.parametrize(
    ("current", "superseded"), [(None, True), (_doc(content_version=2), True), (_doc(), False)]
)
def test_a_result_is_superseded_by_a_delete_or_a_newer_version(
    current: Document | None, superseded: bool
) -> None:
    assert lifecycle.superseded(current, 1) == superseded

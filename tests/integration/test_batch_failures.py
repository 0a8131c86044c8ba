"""A batch that fails as a whole fails none of its documents for another's sake: one tenant's
document that takes its batch past the time limit would otherwise fail every other tenant's
document batched with it, for good. Nor does a document of many chunks take others along, to wait
for all of them. The stage here is parse made a batched one, so the batch is whatever the test
announces; the records and the broker are the real ones."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from shared.config import Settings
from shared.errors import ErrorCode, PermanentError, RaglineError
from shared.ingest import QUEUE_LEASE, StageRef
from shared.models import DocStatus, Document, KnowledgeBase, Stage, utcnow
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import new_kb, orphan, wait_terminal
from workers import peers
from workers.context import WorkerContext
from workers.pipeline import STAGES
from workers.runner import Retry, run_stage
from workers.stages.base import StageResult, Stages, TurnEnded

pytestmark = pytest.mark.integration


def _waiting(
    registry: Registry, settings: Settings, kb: KnowledgeBase, name: str, chunk_count: int = 0
) -> StageRef:
    """A queued document with no task anywhere: only this test's run_stage moves it."""
    orphan(
        registry,
        settings,
        kb,
        name,
        f"{name}: the harbour log.\n".encode(),
        lease_until=utcnow() + QUEUE_LEASE,
        chunk_count=chunk_count,
    )
    version = registry.require_doc(kb.tenant_id, kb.kb_id, name).doc.content_version
    return StageRef(kb.tenant_id, kb.kb_id, name, version, Stage.PARSE)


def _stages(batches: list[list[str]], culprit: str) -> Stages:
    def outlasting(ctx: WorkerContext, items: list[tuple[Document, Any]]) -> list[StageResult | RaglineError]:
        batches.append([doc.doc_id for doc, _ in items])
        if any(doc.doc_id == culprit for doc, _ in items):
            raise SoftTimeLimitExceeded()
        return [STAGES.functions[Stage.PARSE](ctx, doc, data) for doc, data in items]

    return replace(STAGES, batches={**STAGES.batches, Stage.PARSE: outlasting})


def test_a_batch_out_of_time_fails_none_of_its_documents_and_each_runs_again_alone(
    registry: Registry, settings: Settings, services: Services
) -> None:
    alice, bob = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    note = _waiting(registry, settings, alice, "alice-note.txt")
    huge = _waiting(registry, settings, bob, "bob-huge.txt")
    peers.announce(services.redis, huge, 1)
    batches: list[list[str]] = []
    with pytest.raises(Retry) as retry:
        run_stage(services, note, _stages(batches, culprit="bob-huge.txt"), 0)
    assert batches == [["alice-note.txt", "bob-huge.txt"]]
    assert retry.value.counted  # the task's own document runs again, alone (below)
    for kb, ref in ((alice, note), (bob, huge)):
        doc = registry.require_doc(kb.tenant_id, kb.kb_id, ref.doc_id).doc
        assert doc.status != DocStatus.FAILED, ref.doc_id
        if ref is huge and doc.claimed_by is not None:
            # The peer was sent again at once, and the stack's worker may have claimed it by now
            # (CI saw it): a claim, not a failure, and it must end ready (below).
            continue
        assert doc.claimed_by is None
        assert doc.error is not None
        assert (doc.error.code, doc.error.retryable) == (ErrorCode.TIMEOUT.value, True)
    # The peer was sent again as a retried task: the real worker runs it with the real stages.
    assert (
        wait_terminal(registry, bob, ["bob-huge.txt"], timeout_s=180)["bob-huge.txt"].status
        == DocStatus.READY
    )


def test_documents_whose_turn_ran_out_wait_at_their_stage_without_error_and_go_on(
    registry: Registry, settings: Settings, services: Services
) -> None:
    """A long stage yields its process after its turn: its documents are released, neither failed
    nor marked as retrying, and sent again to the back of their queue, where the stack's worker
    takes them on (with the real stages) to ready."""
    alice, bob = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    log = _waiting(registry, settings, alice, "alice-log.txt")
    note = _waiting(registry, settings, bob, "bob-note.txt")
    peers.announce(services.redis, note, 1)
    batches: list[list[str]] = []

    def out_of_turn(
        ctx: WorkerContext, items: list[tuple[Document, Any]]
    ) -> list[StageResult | RaglineError]:
        batches.append([doc.doc_id for doc, _ in items])
        raise TurnEnded(1, 2)

    run_stage(services, log, replace(STAGES, batches={**STAGES.batches, Stage.PARSE: out_of_turn}), 0)

    assert batches == [["alice-log.txt", "bob-note.txt"]]
    for kb, ref in ((alice, log), (bob, note)):
        doc = registry.require_doc(kb.tenant_id, kb.kb_id, ref.doc_id).doc
        assert doc.status != DocStatus.FAILED, ref.doc_id  # the stack's worker may have it by now
        assert doc.error is None, ref.doc_id  # a turn is no failure, nor a retry
        assert doc.attempts <= 1, ref.doc_id  # a released turn is no lost claim
    done = wait_terminal(registry, alice, ["alice-log.txt"], timeout_s=180)
    assert done["alice-log.txt"].status == DocStatus.READY
    assert (
        wait_terminal(registry, bob, ["bob-note.txt"], timeout_s=180)["bob-note.txt"].status
        == DocStatus.READY
    )


def test_a_retried_document_runs_alone_and_its_own_failure_is_its_own(
    registry: Registry, settings: Settings, services: Services
) -> None:
    alice, bob = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    huge = _waiting(registry, settings, bob, "bob-huge.txt")
    note = _waiting(registry, settings, alice, "alice-note.txt")
    peers.announce(services.redis, note, 1)
    batches: list[list[str]] = []
    try:
        run_stage(services, huge, _stages(batches, culprit="bob-huge.txt"), 1)
        assert batches == [["bob-huge.txt"]]  # the waiting note was not taken along
        failed = registry.require_doc(bob.tenant_id, bob.kb_id, "bob-huge.txt").doc
        assert failed.status == DocStatus.FAILED
        assert failed.error is not None
        assert (failed.error.code, failed.error.retryable) == (ErrorCode.TIMEOUT.value, False)
        assert (
            registry.require_doc(alice.tenant_id, alice.kb_id, "alice-note.txt").doc.status
            == DocStatus.QUEUED
        )
    finally:
        services.redis.delete(peers.waiting_key(Stage.PARSE))


def _announced(services: Services) -> set[str]:
    return {json.loads(raw)["doc_id"] for raw in services.redis.smembers(peers.waiting_key(Stage.PARSE))}


def test_a_document_of_many_chunks_takes_no_other_tenants_documents_along(
    registry: Registry, settings: Settings, services: Services
) -> None:
    alice, bob = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    huge = _waiting(registry, settings, bob, "bob-huge.txt", chunk_count=peers.PEER_CHUNKS)
    note = _waiting(registry, settings, alice, "alice-note.txt")
    peers.announce(services.redis, note, 1)
    batches: list[list[str]] = []
    try:
        run_stage(services, huge, _stages(batches, culprit=""), 0)
        assert batches == [["bob-huge.txt"]]
        assert _announced(services) == {"alice-note.txt"}  # left for its own task or another's
        assert registry.require_doc(alice.tenant_id, alice.kb_id, "alice-note.txt").doc.claimed_by is None
    finally:
        services.redis.delete(peers.waiting_key(Stage.PARSE))


def test_a_batch_takes_waiting_documents_along_up_to_its_bound_in_chunks(
    registry: Registry, settings: Settings, services: Services
) -> None:
    alice, bob, carol = (new_kb(registry, pii_policy="off") for _ in range(3))
    note = _waiting(registry, settings, alice, "alice-note.txt", chunk_count=2)
    big = _waiting(registry, settings, bob, "bob-big.txt")
    small = _waiting(registry, settings, carol, "carol-small.txt")
    peers.announce(services.redis, big, peers.PEER_CHUNKS - 1)  # one chunk too many with the note's
    peers.announce(services.redis, small, 3)
    # One that waits no more (deleted, moved on), too big to take along: else it stays for good.
    gone = StageRef(bob.tenant_id, bob.kb_id, "gone.txt", 1, Stage.PARSE)
    peers.announce(services.redis, gone, peers.PEER_CHUNKS - 1)
    # One that no batch could take along is not announced at all.
    peers.announce(services.redis, StageRef(bob.tenant_id, bob.kb_id, "huge.txt", 1, Stage.PARSE), 9000)
    batches: list[list[str]] = []
    try:
        run_stage(services, note, _stages(batches, culprit=""), 0)
        assert batches == [["alice-note.txt", "carol-small.txt"]]
        assert _announced(services) == {"bob-big.txt"}
    finally:
        services.redis.delete(peers.waiting_key(Stage.PARSE))


def test_an_interactive_document_of_many_chunks_is_embedded_from_the_bulk_queue(
    registry: Registry, settings: Settings, services: Services
) -> None:
    """A small file that makes many chunks held the interactive lane for minutes: every tenant's
    agent waited behind it. Its embedding goes to the bulk queue, through the broker."""
    kb = new_kb(registry, pii_policy="off", chunk_size=64, chunk_overlap=8)
    paragraphs = [
        f"Paragraph {n}: the harbour master logs each vessel, its cargo and its berth." for n in range(40)
    ]
    orphan(
        registry,
        settings,
        kb,
        "long-note.txt",
        "\n\n".join(paragraphs).encode(),
        queue="interactive",
        lease_until=utcnow() + QUEUE_LEASE,
    )
    version = registry.require_doc(kb.tenant_id, kb.kb_id, "long-note.txt").doc.content_version
    api = settings.api.model_copy(update={"interactive_max_chunks": 2})
    here = replace(services, settings=settings.model_copy(update={"api": api}))

    def not_here(*_: Any) -> Any:
        raise AssertionError("embedded in the interactive task")

    stages = replace(
        STAGES,
        functions={**STAGES.functions, Stage.EMBED: not_here},
        batches={**STAGES.batches, Stage.EMBED: not_here},
    )
    run_stage(here, StageRef(kb.tenant_id, kb.kb_id, "long-note.txt", version, Stage.PARSE), stages, 0)
    doc = wait_terminal(registry, kb, ["long-note.txt"], timeout_s=180)["long-note.txt"]
    assert doc.status == DocStatus.READY, doc.error
    assert doc.chunk_count > 2
    assert doc.queue == "bulk"


def test_a_result_that_cannot_be_handed_on_records_its_error_and_holds_back_no_other_document(
    registry: Registry, settings: Settings, services: Services
) -> None:
    """An error after the stage's work, in its hand-over (here the artifact cannot be written: a
    lone surrogate, as a JSON escape once produced), is classified like the stage's own: the
    document stays claimed at its stage with the error recorded, the reconciler sends the stage
    again when the lease runs out, and the rest of the batch goes on. It used to escape the task
    untyped: nothing recorded why, and the batch's later documents waited out the lease."""
    alice, bob = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    culprit = _waiting(registry, settings, alice, "alice-odd.txt")
    note = _waiting(registry, settings, bob, "bob-note.txt")
    peers.announce(services.redis, note, 1)

    def unwritable_for_alice(
        ctx: WorkerContext, items: list[tuple[Document, Any]]
    ) -> list[StageResult | RaglineError]:
        results = [STAGES.functions[Stage.PARSE](ctx, doc, data) for doc, data in items]
        return [
            replace(result, artifact={**result.artifact, "odd": "\ud800"})
            if doc.doc_id == culprit.doc_id
            else result
            for (doc, _), result in zip(items, results, strict=True)
        ]

    run_stage(
        services, culprit, replace(STAGES, batches={**STAGES.batches, Stage.PARSE: unwritable_for_alice}), 0
    )

    doc = registry.require_doc(alice.tenant_id, alice.kb_id, culprit.doc_id).doc
    assert (doc.status, doc.stage, doc.claimed_by is not None) == (DocStatus.PARSING, Stage.PARSE, True)
    assert doc.error is not None
    assert (doc.error.code, doc.error.stage, doc.error.retryable) == (ErrorCode.INTERNAL.value, "parse", True)
    assert "UnicodeEncodeError" in doc.error.message
    # The other document of the batch was handed on (its light stages ran here), not left claimed
    # at parse; the stack's worker takes it to ready.
    assert registry.require_doc(bob.tenant_id, bob.kb_id, note.doc_id).doc.stage != Stage.PARSE
    assert wait_terminal(registry, bob, [note.doc_id], timeout_s=180)[note.doc_id].status == DocStatus.READY
    # Once the lease runs out the reconciler sends parse again, whose real result is written.
    done = wait_terminal(registry, alice, [culprit.doc_id], timeout_s=300)[culprit.doc_id]
    assert (done.status, done.error) == (DocStatus.READY, None)


@pytest.mark.parametrize(
    "error",
    [PermanentError("unusable", code=ErrorCode.INTERNAL), SoftTimeLimitExceeded()],
    ids=["permanent", "timed-out"],
)
def test_an_error_after_the_hand_over_landed_leaves_the_document_where_it_moved(
    registry: Registry, settings: Settings, services: Services, error: Exception
) -> None:
    """An error after the hand-over's own write landed (in the step it runs once the record is
    written, as store's retiring of an old generation) neither fails nor marks the document, which
    has moved on; a soft time limit still ends the task, as it did."""
    kb = new_kb(registry, pii_policy="off")
    ref = _waiting(registry, settings, kb, "after.txt")

    def then_failing(
        ctx: WorkerContext, items: list[tuple[Document, Any]]
    ) -> list[StageResult | RaglineError]:
        def fail() -> None:
            raise error

        return [replace(STAGES.functions[Stage.PARSE](ctx, doc, data), after=fail) for doc, data in items]

    # Nothing chains, so parse's hand-over is written, then `after` runs (before the send).
    stages = replace(STAGES, batches={**STAGES.batches, Stage.PARSE: then_failing}, chained=frozenset())
    if isinstance(error, SoftTimeLimitExceeded):
        with pytest.raises(SoftTimeLimitExceeded):
            run_stage(services, ref, stages, 0)
    else:
        run_stage(services, ref, stages, 0)
    doc = registry.require_doc(kb.tenant_id, kb.kb_id, ref.doc_id).doc
    assert doc.status != DocStatus.FAILED
    assert doc.stage != Stage.PARSE
    assert doc.error is None

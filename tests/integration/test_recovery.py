"""Nothing accepted is lost: the reconciler resends lost work, and duplicate deliveries do no harm."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from celery.exceptions import Retry as CeleryRetry
from kombu.exceptions import OperationalError
from opensearchpy import OpenSearch
from opensearchpy.exceptions import ConnectionError as OpenSearchConnectionError

from shared.config import Settings
from shared.errors import ErrorCode, OutageError, RaglineError, TransientError
from shared.ingest import QUEUE_LEASE, STAGE_TASK, Ingestor, StageRef
from shared.models import PIPELINE, STAGE_STATUS, DocStatus, Document, ErrorInfo, Stage, utcnow
from shared.queue import enqueue
from shared.registry import Conflict, Registry, Versioned
from shared.wiring import Services
from tests.integration.helpers import chunks_of, new_kb, orphan, wait_terminal
from workers import liveness
from workers.context import WorkerContext
from workers.handover import hand_over, resend
from workers.lease import WORKER_ID, stage_lease
from workers.pipeline import STAGES
from workers.reconciler import EPOCH_KEY
from workers.runner import Retry, run_chained, run_stage
from workers.stages import parse
from workers.stages.base import StageResult

pytestmark = pytest.mark.integration


@pytest.fixture
def worker_ctx(services: Services) -> WorkerContext:
    """What a worker process's stages get, wired as a worker wires them."""
    return services


def test_a_document_whose_send_was_lost_is_sent_again(registry: Registry, settings: Settings) -> None:
    kb = new_kb(registry, pii_policy="off")
    expired = utcnow() - timedelta(seconds=1)
    # What submit leaves behind when the broker is down: a queued record, no task anywhere.
    orphan(
        registry,
        settings,
        kb,
        "lost.txt",
        b"The lighthouse keeper logs every ship.\n",
        lease_until=expired,
    )
    doc = wait_terminal(registry, kb, ["lost.txt"], timeout_s=180)["lost.txt"]
    assert doc.status == DocStatus.READY


def test_a_dead_workers_reserved_tasks_are_sent_again_without_waiting_out_their_lease(
    registry: Registry, settings: Settings, redis_client: redis.Redis
) -> None:
    kb = new_kb(registry, pii_policy="off")
    # Queued with a long lease and no task anywhere: what a worker killed while holding the
    # document's reserved (prefetched) task leaves behind. Only its silence tells.
    orphan(
        registry,
        settings,
        kb,
        "reserved.txt",
        b"A task a dying worker had reserved.\n",
        lease_until=utcnow() + QUEUE_LEASE,
    )
    redis_client.hset(liveness.WORKERS_KEY, "a-dead-host:4242", str(time.time() - 3600))
    doc = wait_terminal(registry, kb, ["reserved.txt"], timeout_s=180)["reserved.txt"]
    assert doc.status == DocStatus.READY
    assert not redis_client.hexists(liveness.WORKERS_KEY, "a-dead-host:4242")


def test_a_document_whose_workers_keep_dying_ends_retries_exhausted(
    registry: Registry, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    limit = settings.celery.max_retries + 1
    # What a document looks like after `limit` workers died holding it: claimed, lease run out.
    orphan(
        registry,
        settings,
        kb,
        "poison.txt",
        b"A document that every worker dies on.\n",
        status=DocStatus.PARSING,
        stage=Stage.PARSE,
        attempts=limit,
        claimed_by="a-dead-host:4242",
        lease_until=utcnow() - timedelta(seconds=1),
        error=ErrorInfo(code="TIMEOUT", stage="parse", message="the parse stage ran out of time"),
    )
    doc = wait_terminal(registry, kb, ["poison.txt"], timeout_s=180)["poison.txt"]
    print(f"after {limit} lost claims: {doc.status}, {doc.error}")
    assert doc.status == DocStatus.FAILED
    assert doc.error is not None
    assert doc.error.code == "RETRIES_EXHAUSTED"
    assert "last error: TIMEOUT" in doc.error.message


def test_broker_flushed_mid_load_loses_nothing(
    registry: Registry, ingestor: Ingestor, redis_client: redis.Redis
) -> None:
    kb = new_kb(registry, pii_policy="off")
    names = [f"flush-{i}.txt" for i in range(40)]
    for i, name in enumerate(names):
        ingestor.submit(
            kb.tenant_id,
            kb.kb_id,
            f"Record {i}: the ferry {i * 5} docked at pier {i % 9}.\n".encode(),
            filename=name,
        )
    time.sleep(2)
    redis_client.flushall()  # queues, unacknowledged tasks, caches: all gone
    docs = wait_terminal(registry, kb, names, timeout_s=300)
    assert {d.status for d in docs.values()} == {DocStatus.READY}


def test_duplicate_delivery_makes_one_set_of_chunks(
    registry: Registry, ingestor: Ingestor, sender: Celery, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    text = ("A paragraph about tidal energy and the turbines under the bay. " * 30 + "\n\n") * 4
    result = ingestor.submit(kb.tenant_id, kb.kb_id, text.encode(), filename="twice.txt")
    ref = StageRef(kb.tenant_id, kb.kb_id, "twice.txt", result.content_version, Stage.PARSE)
    for _ in range(2):  # redelivery, as after a visibility timeout
        enqueue(sender, settings, STAGE_TASK, kwargs=ref.as_kwargs(), queue="bulk")
    doc = wait_terminal(registry, kb, ["twice.txt"])["twice.txt"]
    assert doc.status == DocStatus.READY
    for stage in (Stage.CHUNK, Stage.STORE):  # late duplicates of later stages
        late = StageRef(kb.tenant_id, kb.kb_id, "twice.txt", result.content_version, stage)
        enqueue(sender, settings, STAGE_TASK, kwargs=late.as_kwargs(), queue="interactive")
    time.sleep(3)
    chunks = chunks_of(opensearch, settings, kb, "twice.txt")
    after = registry.require_doc(kb.tenant_id, kb.kb_id, "twice.txt").doc
    assert after.status == DocStatus.READY
    assert after.transitions == doc.transitions
    assert len(chunks) == doc.chunk_count > 1
    assert sorted(c["chunk_idx"] for c in chunks) == list(range(doc.chunk_count))


class ReplyLostRegistry(Registry):
    """The real registry, whose document writes land in OpenSearch but whose replies are lost, as
    when a node stops between applying a write and answering it."""

    def replace_doc(self, current: Versioned, doc: Document) -> Versioned:
        super().replace_doc(current, doc)
        raise OpenSearchConnectionError("N/A", "the node stopped before it answered", None)


def settled(client: redis.Redis, settings: Settings, timeout_s: float = 90) -> None:
    """Wait until the reconciler has no reason to send every active document again: the broker's
    epoch is back after a flush, and no worker left its beat behind (the tests above make both).
    A claim this test holds by hand would otherwise be taken from it at the next round."""
    dead_after = settings.celery.worker_silent_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        beats = [float(v) for v in client.hgetall(liveness.WORKERS_KEY).values()]
        if client.exists(EPOCH_KEY) and all(time.time() - beat < dead_after for beat in beats):
            return
        time.sleep(0.5)
    pytest.fail("the reconciler did not settle")


def test_a_hand_over_whose_reply_was_lost_still_sends_the_next_stage(
    registry: Registry, settings: Settings, opensearch: OpenSearch, worker_ctx: WorkerContext
) -> None:
    settled(worker_ctx.redis, settings)
    kb = new_kb(registry, pii_policy="off")
    # The parse stage of "reply-lost.txt" has claimed the document and done its work here...
    orphan(
        registry,
        settings,
        kb,
        "reply-lost.txt",
        b"The harbour master writes the tide table each morning.\n",
        status=DocStatus.PARSING,
        stage=Stage.PARSE,
        attempts=1,
        claimed_by="this-test",
        lease_until=utcnow() + timedelta(seconds=60),
    )
    blobs = worker_ctx.blobs
    claimed = registry.get_doc(kb.tenant_id, kb.kb_id, "reply-lost.txt")
    assert claimed is not None
    ctx = replace(worker_ctx, registry=ReplyLostRegistry(opensearch, settings))
    with blobs.local_file(claimed.doc.content_hash) as path:
        result = parse.run(ctx, claimed.doc, path)
    ref = StageRef(kb.tenant_id, kb.kb_id, "reply-lost.txt", claimed.doc.content_version, Stage.PARSE)
    # ...and hands it to the chunk stage: the write lands, the reply is lost.
    with pytest.raises(OpenSearchConnectionError):
        hand_over(ctx, ref, claimed, result, 0.1)
    moved = registry.get_doc(kb.tenant_id, kb.kb_id, "reply-lost.txt")
    assert moved is not None
    assert moved.doc.status == DocStatus.CHUNKING
    # Released by this parse (the chunk task the hand-over sent may have claimed it already).
    assert moved.doc.claimed_by != "this-test"
    # Unclaimed with a 30-minute queue lease: only a sent chunk task brings it to ready in time.
    doc = wait_terminal(registry, kb, ["reply-lost.txt"], timeout_s=120)["reply-lost.txt"]
    assert doc.status == DocStatus.READY


@pytest.mark.parametrize(("lease_s", "written"), [(60, False), (10, True)])
def test_a_chained_hand_over_is_written_only_when_the_claims_lease_runs_short(
    registry: Registry, settings: Settings, worker_ctx: WorkerContext, lease_s: int, written: bool
) -> None:
    """Not writing a chained hand-over saves a registry write a stage, and the next write records
    it. Only a write renews the lease the reconciler watches, so with less than half a stage lease
    left the hand-over is written, as the next stage's claim."""
    settled(worker_ctx.redis, settings)
    kb = new_kb(registry, pii_policy="off")
    name = f"hand-over-{lease_s}.txt"
    held_until = utcnow() + timedelta(seconds=lease_s)
    orphan(
        registry,
        settings,
        kb,
        name,
        b"The pilot boards each tanker at the outer buoy.\n",
        status=DocStatus.PARSING,
        stage=Stage.PARSE,
        attempts=1,
        claimed_by=WORKER_ID,
        lease_until=held_until,
    )
    claimed = registry.require_doc(kb.tenant_id, kb.kb_id, name)
    claim_seq_no = claimed.seq_no
    with worker_ctx.blobs.local_file(claimed.doc.content_hash) as path:
        result = parse.run(worker_ctx, claimed.doc, path)
    ref = StageRef(kb.tenant_id, kb.kb_id, name, claimed.doc.content_version, Stage.PARSE)
    item = hand_over(worker_ctx, ref, claimed, result, 0.1, STAGES)
    assert item is not None
    assert item.ref.stage == Stage.CHUNK
    assert (item.claim.doc.status, item.claim.doc.claimed_by) == (DocStatus.CHUNKING, WORKER_ID)
    stored = registry.require_doc(kb.tenant_id, kb.kb_id, name)
    assert stored.seq_no == item.claim.seq_no  # the next write is fenced by what the registry holds
    if written:
        assert stored.seq_no > claim_seq_no
        assert (stored.doc.status, stored.doc.stage, stored.doc.claimed_by) == (
            DocStatus.CHUNKING,
            Stage.CHUNK,
            WORKER_ID,
        )
        assert stored.doc.lease_until is not None
        assert stored.doc.lease_until > utcnow() + stage_lease(worker_ctx.settings) - timedelta(seconds=5)
    else:
        assert stored.seq_no == claim_seq_no
        assert (stored.doc.status, stored.doc.stage, stored.doc.lease_until) == (
            DocStatus.PARSING,
            Stage.PARSE,
            held_until,
        )
    # The rest of the chain as the task runs it: the hand-over to embed records every stage.
    pending = [item]
    while pending:
        pending = run_chained(worker_ctx, pending, STAGES, time.monotonic() + 60)
    doc = wait_terminal(registry, kb, [name], timeout_s=120)[name]
    assert doc.status == DocStatus.READY
    assert set(doc.timings) == {"parse", "chunk", "enrich", "pii", "embed", "store"}
    statuses = [t["status"] for t in doc.transitions]
    after = PIPELINE[PIPELINE.index(Stage.PARSE) + 1 :]
    after_parse = [STAGE_STATUS[stage].value for stage in after] + [DocStatus.READY.value]
    assert statuses[statuses.index(DocStatus.CHUNKING.value) :] == after_parse


class ResendingClient(OpenSearch):
    """A real client that sends each index request a second time, as its transport does when a
    node applies a write and stops before it answers; the caller sees only the second reply."""

    def index(self, *args: Any, **kwargs: Any) -> Any:
        super().index(*args, **kwargs)
        return super().index(*args, **kwargs)


def test_writes_resent_after_their_reply_was_lost_are_not_taken_for_conflicts(
    registry: Registry, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    orphan(registry, settings, kb, "resent.txt", b"Buoys mark the channel.\n", status=DocStatus.QUEUED)
    resending = Registry(ResendingClient(hosts=settings.opensearch.urls), settings)
    current = resending.get_doc(kb.tenant_id, kb.kb_id, "resent.txt")
    assert current is not None
    moved = current.doc.model_copy(update={"status": DocStatus.PARSING, "stage": Stage.PARSE})
    written = resending.replace_doc(current, moved)  # the resend conflicts with the write itself
    assert written.doc.status == DocStatus.PARSING
    stored = registry.get_doc(kb.tenant_id, kb.kb_id, "resent.txt")
    assert stored is not None
    assert (stored.seq_no, stored.doc.status) == (written.seq_no, DocStatus.PARSING)
    # A write that really lost the race still conflicts.
    with pytest.raises(Conflict):
        resending.replace_doc(current, current.doc.model_copy(update={"status": DocStatus.FAILED}))
    # Creates too: a resent create meets itself, not an existing record.
    created = resending.create_doc(moved.model_copy(update={"doc_id": "resent-new.txt"}))
    assert created.doc.doc_id == "resent-new.txt"
    with pytest.raises(Conflict):
        resending.create_doc(moved.model_copy(update={"doc_id": "resent-new.txt", "filename": "other"}))
    other_kb = kb.model_copy(update={"kb_id": f"{kb.kb_id}-resent"})
    assert resending.create_kb(other_kb) == other_kb
    with pytest.raises(Conflict):
        resending.create_kb(other_kb.model_copy(update={"name": "another"}))


def test_a_chained_stage_that_fails_transiently_is_sent_again_as_its_own_task(
    registry: Registry, settings: Settings, worker_ctx: WorkerContext
) -> None:
    kb = new_kb(registry, pii_policy="off")
    # Queued with a long lease and no task anywhere: only this test's run_stage moves it.
    orphan(
        registry,
        settings,
        kb,
        "chained.txt",
        b"The ferry leaves at dawn and returns before the fog.\n",
        lease_until=utcnow() + QUEUE_LEASE,
    )
    failures: list[str] = []

    def flaky_chunk(ctx: WorkerContext, doc: Document, parsed: Any) -> StageResult:
        if not failures:
            failures.append(doc.doc_id)
            raise TransientError("the chunker stumbled once")
        return STAGES.functions[Stage.CHUNK](ctx, doc, parsed)

    stages = replace(STAGES, functions={**STAGES.functions, Stage.CHUNK: flaky_chunk})
    version = registry.require_doc(kb.tenant_id, kb.kb_id, "chained.txt").doc.content_version
    run_stage(worker_ctx, StageRef(kb.tenant_id, kb.kb_id, "chained.txt", version, Stage.PARSE), stages, 0)
    # Parse ran here and chunk after it, in the same call; chunk failed, so the document waits
    # at chunk, released, for a chunk task of its own (a resent parse task would find it moved
    # on and drop itself, and the document would wait out its 30-minute queue lease).
    waiting = registry.require_doc(kb.tenant_id, kb.kb_id, "chained.txt").doc
    assert failures == ["chained.txt"]
    assert (waiting.status, waiting.claimed_by) == (DocStatus.CHUNKING, None)
    assert waiting.error is not None
    assert (waiting.error.stage, waiting.error.retryable) == ("chunk", True)
    assert "parse" in waiting.timings
    doc = wait_terminal(registry, kb, ["chained.txt"], timeout_s=120)["chained.txt"]
    assert doc.status == DocStatus.READY
    assert doc.error is None


def test_a_chained_stage_that_fails_for_good_keeps_the_record_of_the_stages_before_it(
    registry: Registry, settings: Settings, worker_ctx: WorkerContext
) -> None:
    """Chunk's hand-over to enrich is not written (the claim has most of its lease left), so the
    failure's write is the first to record chunk: the failed record has every stage that ran."""
    kb = new_kb(registry, pii_policy="off")
    name = "fails-in-enrich.txt"
    orphan(
        registry,
        settings,
        kb,
        name,
        b"The lock keeper opens the gates at noon.\n",
        lease_until=utcnow() + QUEUE_LEASE,
    )

    def broken_enrich(ctx: WorkerContext, doc: Document, chunked: Any) -> StageResult:
        raise RaglineError("the enricher refuses this document", code=ErrorCode.INVALID_ARGUMENT)

    stages = replace(STAGES, functions={**STAGES.functions, Stage.ENRICH: broken_enrich})
    version = registry.require_doc(kb.tenant_id, kb.kb_id, name).doc.content_version
    run_stage(worker_ctx, StageRef(kb.tenant_id, kb.kb_id, name, version, Stage.PARSE), stages, 0)
    doc = registry.require_doc(kb.tenant_id, kb.kb_id, name).doc
    assert doc.status == DocStatus.FAILED
    assert doc.error is not None
    assert (doc.error.stage, doc.error.code, doc.error.retryable) == ("enrich", "INVALID_ARGUMENT", False)
    assert set(doc.timings) == {"parse", "chunk"}
    assert (doc.claimed_by, doc.lease_until) == (None, None)
    statuses = [t["status"] for t in doc.transitions]
    assert statuses[statuses.index(DocStatus.PARSING.value) :] == [
        DocStatus.PARSING.value,
        DocStatus.CHUNKING.value,
        DocStatus.ENRICHING.value,
        DocStatus.FAILED.value,
    ]


def test_a_resend_the_broker_refuses_hands_the_document_to_the_reconciler(
    registry: Registry, settings: Settings
) -> None:
    """A stage released for retry holds a lease for its resend to cover; when the broker refuses
    the resend, the lease is expired so that the reconciler's next round sends it."""
    kb = new_kb(registry, pii_policy="off")
    orphan(
        registry,
        settings,
        kb,
        "held.txt",
        b"The ferry leaves at dawn.\n",
        status=DocStatus.EMBEDDING,
        stage=Stage.EMBED,
        lease_until=utcnow() + QUEUE_LEASE,
    )
    ref = StageRef(kb.tenant_id, kb.kb_id, "held.txt", 1, Stage.EMBED)

    def refused() -> None:
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    before = utcnow()
    resend(ref, refused, lambda: registry)
    lease = registry.require_doc(kb.tenant_id, kb.kb_id, "held.txt").doc.lease_until
    assert lease is not None
    assert before <= lease <= utcnow()

    def sent() -> None:
        raise CeleryRetry("sent")  # what Task.retry raises once the retry is on the broker

    with pytest.raises(CeleryRetry):
        resend(ref, sent, lambda: registry)


@pytest.mark.parametrize("failure", [OutageError("OpenSearch is unavailable"), TransientError("it stumbled")])
def test_a_document_released_for_a_retry_waits_at_most_a_stage_lease_past_its_countdown(
    failure: RaglineError, registry: Registry, settings: Settings, worker_ctx: WorkerContext
) -> None:
    """Should the process die between the release and the resend, the reconciler takes over after
    the countdown and one stage lease, not after the 30-minute queue lease."""
    kb = new_kb(registry, pii_policy="off")
    data = b"The tide turns at noon.\n"
    orphan(registry, settings, kb, "retried.txt", data, lease_until=utcnow() + QUEUE_LEASE)

    def failing_parse(ctx: WorkerContext, doc: Document, data: Any) -> StageResult:
        raise failure

    stages = replace(STAGES, functions={**STAGES.functions, Stage.PARSE: failing_parse})
    started = utcnow()
    with pytest.raises(Retry) as retry:
        run_stage(worker_ctx, StageRef(kb.tenant_id, kb.kb_id, "retried.txt", 1, Stage.PARSE), stages, 0)
    released = registry.require_doc(kb.tenant_id, kb.kb_id, "retried.txt").doc
    assert released.claimed_by is None
    assert released.error is not None
    assert released.error.retryable
    assert retry.value.counted == (not isinstance(failure, OutageError))
    assert released.lease_until is not None
    wait = released.lease_until - started
    due = timedelta(seconds=retry.value.countdown + settings.celery.stage_lease_s)
    assert due <= wait <= due + timedelta(seconds=5)

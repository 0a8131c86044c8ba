"""Faults survived: workers killed mid-stage, Redis restarted, OpenSearch stopped, during real loads.

Each test loads a few hundred documents, breaks a service with the project's own scripts (or a
SIGKILL), and checks that every document still ends `ready` with exactly one set of chunks. The
recovery times are printed. `make soak` runs the same tests with bigger loads and more faults
(RAGLINE_SOAK_DOCS, RAGLINE_SOAK_ROUNDS).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import datetime

import pytest
from celery import Celery
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import QUEUE_LEASE, STAGE_TASK, Ingestor, StageRef
from shared.models import PIPELINE, STAGE_STATUS, DocStatus, KnowledgeBase, Stage, utcnow
from shared.queue import broker_client, enqueue, ping_workers, stage_queue
from shared.registry import Registry
from tests.integration.helpers import mismatched_chunk_sets, new_kb, orphan, wait_terminal
from tests.integration.stack_control import kill_worker, stack, worker_pid

# A load plus a recovery per fault: far beyond the default per-test timeout on a busy machine.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

DOCS = int(os.environ.get("RAGLINE_SOAK_DOCS", "200"))
ROUNDS = int(os.environ.get("RAGLINE_SOAK_ROUNDS", "1"))
# Far longer than the outage and the recovery, far shorter than the queue lease.
HELD_COUNTDOWN_S = 600
TOPICS = ["glaciers", "tax law", "sourdough", "compilers", "beekeeping", "tides", "opera", "rail freight"]


def _text(i: int) -> bytes:
    topic = TOPICS[i % len(TOPICS)]
    sentence = f"Note {i} on {topic}: entry {i * 7} explains how {topic} changed in year {1900 + i % 120}. "
    paragraphs = 1 if i % 4 else 12  # every fourth document spans several chunks
    return "\n\n".join(sentence * 12 for _ in range(paragraphs)).encode()


def _load(ingestor: Ingestor, kb: KnowledgeBase, prefix: str) -> list[str]:
    names = [f"{prefix}-{i:04d}.txt" for i in range(DOCS)]
    for i, name in enumerate(names):
        ingestor.submit(kb.tenant_id, kb.kb_id, _text(i), filename=name, priority="bulk")
    return names


def _claimed_at(registry: Registry, kb: KnowledgeBase, stage: Stage) -> list[str]:
    registry.client.indices.refresh(index=registry.docs)
    hits = registry.search_docs(
        {
            "bool": {
                "filter": [
                    {"term": {"tenant_id": kb.tenant_id}},
                    {"term": {"kb_id": kb.kb_id}},
                    {"term": {"stage": stage.value}},
                    {"exists": {"field": "claimed_by"}},
                ]
            }
        },
        size=100,
        sort=[{"doc_id": "asc"}],
    )
    return [h["_source"]["doc_id"] for h in hits]


def _wait_claimed(registry: Registry, kb: KnowledgeBase, stage: Stage, timeout_s: float = 300) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := _claimed_at(registry, kb, stage):
            return found
        time.sleep(0.05)
    pytest.fail(f"no document was claimed at {stage} within {timeout_s}s")


def _assert_all_ready_once(
    registry: Registry, opensearch: OpenSearch, settings: Settings, kb: KnowledgeBase, names: list[str]
) -> None:
    docs = wait_terminal(registry, kb, names, timeout_s=900)
    failed = {d: doc.error for d, doc in docs.items() if doc.status != DocStatus.READY}
    wrong = mismatched_chunk_sets(
        opensearch, settings, (kb.tenant_id, kb.kb_id), {d: doc.chunk_count for d, doc in docs.items()}
    )
    print(f"documents lost or failed: {len(failed)}; with duplicate or mixed chunks: {len(wrong)}")
    assert failed == {}
    assert wrong == []


@pytest.fixture
def stack_restored() -> Iterator[None]:
    """Whatever a test breaks, the stack is whole again for the tests after it."""
    yield
    for service in ("opensearch", "redis", "worker"):
        stack("up", service)


def test_worker_killed_mid_parse_embed_and_store_loses_and_duplicates_nothing(
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    stack_restored: None,
) -> None:
    kb = new_kb(registry, pii_policy="off")
    names = _load(ingestor, kb, "kill")
    victims: dict[str, tuple[Stage, datetime]] = {}
    for _ in range(ROUNDS):
        for stage in (Stage.PARSE, Stage.EMBED, Stage.STORE):
            claimed = _wait_claimed(registry, kb, stage)
            killed = kill_worker(settings)
            victims.update({doc_id: (stage, utcnow()) for doc_id in claimed})
            print(f"SIGKILLed worker {killed} holding {len(claimed)} document(s) at {stage}")
            stack("up", "worker")
            assert worker_pid(settings) != killed
    _assert_all_ready_once(registry, opensearch, settings, kb, names)
    print(f"{DOCS} documents, {3 * ROUNDS} kills: all ready")
    waits = sorted(
        wait
        for doc_id, victim in victims.items()
        if (wait := _recovery_s(registry, kb, doc_id, *victim)) is not None
    )
    # A document seen claimed may still have finished its stage in the instant before the kill.
    print(f"{len(waits)} documents were killed mid-stage; seconds until that stage was done again: {waits}")


def _recovery_s(
    registry: Registry, kb: KnowledgeBase, doc_id: str, stage: Stage, killed: datetime
) -> float | None:
    """Seconds from a kill until its victim got past the stage it was killed in (None: it already had)."""
    later = {STAGE_STATUS[s].value for s in PIPELINE[PIPELINE.index(stage) + 1 :]} | {DocStatus.READY.value}
    doc = registry.require_doc(kb.tenant_id, kb.kb_id, doc_id).doc
    passed = [
        at
        for t in doc.transitions
        if t["status"] in later
        if (at := datetime.fromisoformat(t["at"])) > killed
    ]
    return (min(passed) - killed).total_seconds() if passed else None


# Redis for a moment (every client notices), OpenSearch for as long as the outage.
OUTAGES = [("redis", Stage.PARSE, 3), ("opensearch", Stage.EMBED, 30)]


@pytest.mark.parametrize(("service", "stage", "pause_s"), OUTAGES)
def test_a_service_stopped_mid_load_loses_and_fails_nothing(
    service: str,
    stage: Stage,
    pause_s: float,
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    stack_restored: None,
) -> None:
    kb = new_kb(registry, pii_policy="off")
    names = _load(ingestor, kb, service)
    for _ in range(ROUNDS):
        _wait_claimed(registry, kb, stage)
        stack("down", service)
        time.sleep(pause_s)
        stack("up", service)
        print(f"{service} stopped for {pause_s} s mid-load, with a document at {stage}, and started again")
    _assert_all_ready_once(registry, opensearch, settings, kb, names)
    print(f"{DOCS} documents all ready after {service} came back")


def test_tasks_a_worker_held_when_the_broker_went_away_are_sent_again(
    registry: Registry, settings: Settings, sender: Celery, stack_restored: None
) -> None:
    """A lost broker connection drops the tasks the worker reserved or held for a countdown; Redis
    would redeliver them only after its visibility timeout (an hour)."""
    kb = new_kb(registry, pii_policy="off")
    # Queued under the 30-minute queue lease, with its one task waiting out a countdown in the
    # worker: what an outage retry, or a prefetched task, is when Redis goes away.
    orphan(
        registry,
        settings,
        kb,
        "held.txt",
        b"A task the worker held while Redis was away.\n",
        lease_until=utcnow() + QUEUE_LEASE,
    )
    ref = StageRef(kb.tenant_id, kb.kb_id, "held.txt", 1, Stage.PARSE)
    sent = enqueue(
        sender,
        settings,
        STAGE_TASK,
        kwargs=ref.as_kwargs(),
        queue=stage_queue(settings, "bulk", Stage.PARSE),
        countdown=HELD_COUNTDOWN_S,
    )
    _wait_held(settings, sent.id)
    stack("down", "redis")
    time.sleep(3)
    stack("up", "redis")
    doc = wait_terminal(registry, kb, ["held.txt"], timeout_s=240)["held.txt"]
    print(f"a held task's document {doc.status.value} after Redis came back")
    assert doc.status == DocStatus.READY
    # The sender's pooled connection died with Redis: remote control (readiness) still answers.
    assert ping_workers(sender, timeout_s=2.0)


def _wait_held(settings: Settings, task_id: str, timeout_s: float = 120) -> None:
    """Until a worker holds the task for its countdown (a busy one takes it only once it has room).

    With a client of its own, closed after: a connection left in the shared sender's pool would
    be dead once Redis restarts, and remote control (unlike a send) does not reconnect.
    """
    inspector = broker_client(settings)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            held = inspector.control.inspect(timeout=2).scheduled() or {}
            if any(entry["request"]["id"] == task_id for entries in held.values() for entry in entries):
                return
            time.sleep(0.5)
        pytest.fail(f"no worker took task {task_id} within {timeout_s}s")
    finally:
        inspector.close()

"""Bulk work is shared fairly, and every path into the pipeline is admitted by the same rule.

The end-to-end tests run on the real stack (Redis, the worker, OpenSearch). The tests of the turn
order, of admission and of the reconciler's re-send use a Redis database no worker serves, so what
they send stays where they can count it; the registry is the real one.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from shared import fairqueue
from shared.blob_dir import DirBlobStore
from shared.catalog import Catalog
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.ingest import STAGE_TASK, Ingestor, StageRef, Upload
from shared.models import DocStatus, KnowledgeBase, Stage, utcnow
from shared.queue import broker_client
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import new_kb, orphan, wait_terminal
from workers.reconciler import resend_stuck

pytestmark = pytest.mark.integration

QUIET_DB = 13  # a Redis database no worker serves: what is sent there stays countable


def test_a_small_load_overtakes_a_big_one_of_another_tenant(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    """Sixty documents of one tenant, then five of another: the five wait for a few turns of the
    sixty, not for all of them. Counted from the five's arrival, since how many of the sixty are
    done before then only says how fast the machine is."""
    big, small = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    big_load = [
        Upload(f"Big load item {i} about cargo {i * 3}.\n".encode(), filename=f"big-{i}.txt")
        for i in range(60)
    ]
    small_load = [
        Upload(f"Small load item {i} about ferns.\n".encode(), filename=f"small-{i}.txt") for i in range(5)
    ]
    catalog = Catalog(settings, registry, ingestor)
    try:
        ingestor.submit_many(big.tenant_id, big.kb_id, big_load, priority="bulk")
        ingestor.submit_many(small.tenant_id, small.kb_id, small_load, priority="bulk")
        big_waiting = fairqueue.pending(ingestor.broker, big.tenant_id)
        big_ready_before = _ready_count(registry, big)
        docs = wait_terminal(registry, small, [upload.filename or "" for upload in small_load], timeout_s=500)
        big_ready = _ready_count(registry, big)
        seen = (
            f"when the other tenant's 5 documents arrived, {big_waiting} of the 60 waited in their lane and "
            f"{big_ready_before} were ready; when the 5 were ready, {big_ready} were"
        )
        print(seen)
        assert all(doc.status == DocStatus.READY for doc in docs.values()), seen
        assert big_waiting >= 30, seen  # in a first-come queue the five would wait for all of these
        # Ahead of the five: the queue's depth (8), a turn of the sixty beside each of theirs, and
        # about the depth again while the last of them goes through its stages.
        assert big_ready - big_ready_before < 30, seen
    finally:
        catalog.delete_kb(big.tenant_id, big.kb_id)  # what is left of the big load waits for nothing
        catalog.delete_kb(small.tenant_id, small.kb_id)


def _ready_count(registry: Registry, kb: KnowledgeBase) -> int:
    registry.client.indices.refresh(index=registry.docs)
    scope = [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"kb_id": kb.kb_id}}]
    query = {"bool": {"filter": [*scope, {"term": {"status": DocStatus.READY.value}}]}}
    return int(registry.client.count(index=registry.docs, body={"query": query})["count"])


def test_ten_documents_finish_while_another_tenant_has_a_thousand_waiting(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    backlog, small = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    catalog = Catalog(settings, registry, ingestor)

    def load(i: int) -> object:
        return ingestor.submit(
            backlog.tenant_id,
            backlog.kb_id,
            f"Backlog note {i}: crate {i} waits at gate {i % 9}.\n".encode(),
            filename=f"backlog-{i:04d}.txt",
            priority="bulk",
        )

    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            assert len(list(pool.map(load, range(1000)))) == 1000
        backlog_ready_before = _ready_count(registry, backlog)
        names = [f"small-{i}.txt" for i in range(10)]
        for i, name in enumerate(names):
            ingestor.submit(
                small.tenant_id,
                small.kb_id,
                f"Small note {i} about lichens on stone {i}.\n".encode(),
                filename=name,
                priority="bulk",
            )
        docs = wait_terminal(registry, small, names, timeout_s=600)
        backlog_waiting = fairqueue.pending(ingestor.broker, backlog.tenant_id)
        backlog_ready = _ready_count(registry, backlog)
        print(
            f"the 10 documents were ready while {backlog_waiting} of the other tenant's 1000 still "
            f"waited in its lane; {backlog_ready} of them were ready ({backlog_ready_before} when "
            "the 10 arrived)"
        )
        assert all(doc.status == DocStatus.READY for doc in docs.values())
        assert backlog_waiting >= 500
    finally:
        catalog.delete_kb(backlog.tenant_id, backlog.kb_id)  # purges its lane: later tests wait for nothing
        catalog.delete_kb(small.tenant_id, small.kb_id)
    assert fairqueue.pending(ingestor.broker, backlog.tenant_id) == 0


@dataclass
class Quiet:
    """A Redis database, a sender to it and settings naming it."""

    redis: redis.Redis
    sender: Celery
    settings: Settings

    def sent(self, queue: str) -> list[dict[str, Any]]:
        """The kwargs of the tasks waiting in a Celery queue, oldest first."""
        messages = [json.loads(raw) for raw in reversed(self.redis.lrange(queue, 0, -1))]
        return [json.loads(base64.b64decode(message["body"]))[1] for message in messages]


@pytest.fixture
def quiet(settings: Settings) -> Iterator[Quiet]:
    url = settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}"
    quiet_settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield Quiet(client, broker_client(quiet_settings), quiet_settings)
    client.flushdb()
    client.close()


@pytest.fixture
def quiet_kbs(quiet: Quiet, registry: Registry, services: Services) -> Iterator[list[KnowledgeBase]]:
    """Knowledge bases a test makes; deleted afterwards with their records, so no reconciler ever
    sends their never-started documents."""
    made: list[KnowledgeBase] = []
    yield made
    ingestor = Ingestor(quiet.settings, registry, services.blobs, quiet.sender, quiet.redis)
    for kb in made:
        Catalog(quiet.settings, registry, ingestor).delete_kb(kb.tenant_id, kb.kb_id)


def _push(quiet: Quiet, tenant: str, kb: str, doc_id: str) -> None:
    ref = StageRef(tenant, kb, doc_id, 1, Stage.PARSE)
    fairqueue.push(quiet.redis, tenant, kb, STAGE_TASK, ref.as_kwargs())


def test_a_tenant_with_many_kbs_gets_the_share_of_a_tenant_with_one(quiet: Quiet) -> None:
    for kb in range(5):
        for i in range(20):
            _push(quiet, "many", f"kb{kb}", f"d{i}")
    for i in range(100):
        _push(quiet, "one", "kb", f"d{i}")
    moved = fairqueue.feed(quiet.redis, quiet.sender, quiet.settings, depth=40)
    sent = quiet.sent(fairqueue.BULK_QUEUE)
    tenants = Counter(task["tenant_id"] for task in sent)
    kbs = Counter(task["kb_id"] for task in sent if task["tenant_id"] == "many")
    print(f"first {moved} admitted: {dict(tenants)}; the five-KB tenant's by KB: {dict(kbs)}")
    assert moved == len(sent) == 40
    assert tenants == {"many": 20, "one": 20}
    assert sorted(kbs.values()) == [4, 4, 4, 4, 4]  # its KBs share its turn in turn
    assert fairqueue.pending(quiet.redis, "many") == 80
    assert fairqueue.pending(quiet.redis, "one") == 80


def _ingestor(quiet: Quiet, registry: Registry, tmp_path: Path, **api: Any) -> Ingestor:
    settings = quiet.settings.model_copy(update={"api": quiet.settings.api.model_copy(update=api)})
    return Ingestor(settings, registry, DirBlobStore(tmp_path / "blobstore"), quiet.sender, quiet.redis)


def _refused(call: Any) -> RaglineError:
    with pytest.raises(RaglineError) as refused:
        call()
    return refused.value


def test_interactive_is_a_small_per_tenant_quota_and_every_path_meets_the_bound(
    quiet: Quiet, registry: Registry, tmp_path: Path, quiet_kbs: list[KnowledgeBase]
) -> None:
    """Quota 2, bound 3: the third interactive document waits in the lane; the bound then holds for
    every path, an interactive request and a re-ingest included; a finished document frees its slot."""
    ingestor = _ingestor(
        quiet, registry, tmp_path, interactive_max_in_flight=2, max_queued_tasks=3, interactive_max_bytes=1000
    )
    kb = new_kb(registry, pii_policy="off")
    quiet_kbs.append(kb)
    small = [f"agent-{i}.txt" for i in range(3)]
    for i, name in enumerate(small):
        ingestor.submit(
            kb.tenant_id, kb.kb_id, f"Agent note {i}.".encode(), filename=name, priority="interactive"
        )
    queues = [registry.require_doc(kb.tenant_id, kb.kb_id, name).doc.queue for name in small]
    assert queues == ["interactive", "interactive", "bulk"]
    assert len(quiet.sent("interactive")) == 2
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 1

    # A large document is never interactive, asked or not.
    large = b"A large report. " * 100
    ingestor.submit(kb.tenant_id, kb.kb_id, large, filename="large-0.txt", priority="interactive")
    ingestor.submit(kb.tenant_id, kb.kb_id, large + b"1", filename="large-1.txt")
    assert registry.require_doc(kb.tenant_id, kb.kb_id, "large-0.txt").doc.queue == "bulk"
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 3

    # At the bound: bulk, a third interactive document (over the quota) and a re-ingest get 429.
    for call in (
        lambda: ingestor.submit(kb.tenant_id, kb.kb_id, large + b"2", filename="large-2.txt"),
        lambda: ingestor.submit(
            kb.tenant_id, kb.kb_id, b"One more.", filename="x.txt", priority="interactive"
        ),
        lambda: ingestor.reingest(kb.tenant_id, kb.kb_id, "agent-0.txt"),
    ):
        assert _refused(call).code == ErrorCode.RATE_LIMITED
    assert registry.get_doc(kb.tenant_id, kb.kb_id, "x.txt") is None
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 3

    # Once an interactive document is finished, its slot takes the next one.
    done = registry.require_doc(kb.tenant_id, kb.kb_id, "agent-0.txt")
    registry.replace_doc(done, done.doc.model_copy(update={"status": DocStatus.READY}))
    ingestor.submit(
        kb.tenant_id, kb.kb_id, b"Next agent note.", filename="agent-3.txt", priority="interactive"
    )
    assert registry.require_doc(kb.tenant_id, kb.kb_id, "agent-3.txt").doc.queue == "interactive"
    assert ingestor.admitter.interactive_in_flight(kb.tenant_id) == 2


def test_bulk_priority_opts_out_and_a_request_is_admitted_whole(
    quiet: Quiet, registry: Registry, tmp_path: Path, quiet_kbs: list[KnowledgeBase]
) -> None:
    ingestor = _ingestor(quiet, registry, tmp_path, max_queued_tasks=4)
    kb = new_kb(registry, pii_policy="off")
    quiet_kbs.append(kb)
    ingestor.submit(kb.tenant_id, kb.kb_id, b"Small but bulk.", filename="bulk.txt", priority="bulk")
    assert registry.require_doc(kb.tenant_id, kb.kb_id, "bulk.txt").doc.queue == "bulk"
    uploads = [Upload(f"File {i}.".encode(), filename=f"f{i}.txt") for i in range(4)]
    refused = _refused(lambda: ingestor.submit_many(kb.tenant_id, kb.kb_id, uploads))
    assert refused.code == ErrorCode.RATE_LIMITED
    assert all(registry.get_doc(kb.tenant_id, kb.kb_id, f"f{i}.txt") is None for i in range(4))
    ingestor.submit_many(kb.tenant_id, kb.kb_id, uploads[:3])
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 4
    bad = _refused(lambda: ingestor.submit(kb.tenant_id, kb.kb_id, b"x", filename="y.txt", priority="urgent"))
    assert bad.code == ErrorCode.INVALID_ARGUMENT


def test_the_reconciler_sends_a_lost_bulk_document_through_its_lane_once(
    services: Services, quiet: Quiet, registry: Registry, settings: Settings, quiet_kbs: list[KnowledgeBase]
) -> None:
    kb = new_kb(registry, pii_policy="off")
    quiet_kbs.append(kb)
    # A queued bulk document whose lane entry is gone (its lease is in the future, so the stack's
    # own reconciler leaves it to this test).
    orphan(
        registry,
        settings,
        kb,
        "lost.txt",
        b"A lost note.",
        queue="bulk",
        lease_until=utcnow() + timedelta(hours=1),
    )
    ctx = replace(services, settings=quiet.settings, sender=quiet.sender, redis=quiet.redis)
    assert resend_stuck(ctx, registry.require_doc(kb.tenant_id, kb.kb_id, "lost.txt")) is True
    assert quiet.sent(fairqueue.BULK_QUEUE) == []  # not past the lanes
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 1
    assert fairqueue.is_waiting(quiet.redis, kb.tenant_id, kb.kb_id, "lost.txt", 1)
    # Still waiting its turn: the next round only renews its lease.
    assert resend_stuck(ctx, registry.require_doc(kb.tenant_id, kb.kb_id, "lost.txt")) is False
    assert fairqueue.pending(quiet.redis, kb.tenant_id) == 1
    # The feeder sends it, and a lane entry lost after that would be re-sent again.
    assert fairqueue.feed(quiet.redis, quiet.sender, quiet.settings, depth=8) == 1
    assert [task["doc_id"] for task in quiet.sent(fairqueue.BULK_QUEUE)] == ["lost.txt"]
    assert not fairqueue.is_waiting(quiet.redis, kb.tenant_id, kb.kb_id, "lost.txt", 1)


def test_a_document_whose_worker_died_mid_parse_goes_back_to_the_head_of_its_lane(
    services: Services, quiet: Quiet, registry: Registry, settings: Settings, quiet_kbs: list[KnowledgeBase]
) -> None:
    """It had its turn: at the tail it waited for all its tenant queued since (18 minutes in a
    fault test under load); a document that never started keeps its place at the tail."""
    kb = new_kb(registry, pii_policy="off")
    quiet_kbs.append(kb)
    later = utcnow() + timedelta(hours=1)  # the stack's own reconciler leaves these to the test
    for name in ("waiting-0.txt", "waiting-1.txt"):
        _push(quiet, kb.tenant_id, kb.kb_id, name)
    orphan(registry, settings, kb, "killed.txt", b"Killed mid-parse.", queue="bulk", lease_until=later)
    killed = registry.require_doc(kb.tenant_id, kb.kb_id, "killed.txt")
    registry.replace_doc(
        killed, killed.doc.model_copy(update={"status": DocStatus.PARSING, "stage": Stage.PARSE})
    )
    orphan(registry, settings, kb, "lost.txt", b"Never started.", queue="bulk", lease_until=later)
    ctx = replace(services, settings=quiet.settings, sender=quiet.sender, redis=quiet.redis)
    for name in ("killed.txt", "lost.txt"):
        assert resend_stuck(ctx, registry.require_doc(kb.tenant_id, kb.kb_id, name)) is True
    assert fairqueue.feed(quiet.redis, quiet.sender, quiet.settings, depth=8) == 4
    order = [task["doc_id"] for task in quiet.sent(fairqueue.BULK_QUEUE)]
    assert order == ["killed.txt", "waiting-0.txt", "waiting-1.txt", "lost.txt"]


def test_bulk_loads_advance_while_another_tenant_keeps_the_interactive_queue_busy(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    """One tenant sends a single small document every 100 ms, so its interactive quota is always
    full and the interactive queue never empties; another sends a bulk load of three. With strict
    interactive-first order the three waited for the stream to stop (an adversary's stream held
    them 90 s, and would have for ever)."""
    streamer, loader = new_kb(registry, pii_policy="off"), new_kb(registry, pii_policy="off")
    catalog = Catalog(settings, registry, ingestor)
    stop = threading.Event()
    streamed: list[str] = []

    def stream() -> None:
        while not stop.wait(0.1):
            name = f"note-{len(streamed):05d}.txt"
            try:
                ingestor.submit(
                    streamer.tenant_id,
                    streamer.kb_id,
                    f"Agent note {len(streamed)} on kilns.\n".encode(),
                    filename=name,
                    priority="interactive",
                )
            except RaglineError as refused:  # its bulk lane (past the quota) is full: it keeps trying
                if refused.code != ErrorCode.RATE_LIMITED:
                    raise
                continue
            streamed.append(name)

    thread = threading.Thread(target=stream, daemon=True)
    try:
        thread.start()
        time.sleep(3)  # the stream is under way
        load = [
            Upload(f"Bulk item {i} about moorland.\n".encode(), filename=f"bulk-{i}.txt") for i in range(3)
        ]
        ingestor.submit_many(loader.tenant_id, loader.kb_id, load, priority="bulk")
        streamed_before = _ready_count(registry, streamer)
        docs = wait_terminal(registry, loader, [u.filename or "" for u in load], timeout_s=300)
        streamed_meanwhile = _ready_count(registry, streamer) - streamed_before
        streaming = thread.is_alive()
        busy = ingestor.admitter.interactive_in_flight(streamer.tenant_id)
        print(
            f"while the bulk load waited, {streamed_meanwhile} of the stream's documents were made ready; "
            f"{busy} were unfinished on the interactive queue when it was done"
        )
        assert all(doc.status == DocStatus.READY for doc in docs.values())
        assert streaming
        assert busy > 0
        # A bulk task in every four asks: the load's three documents take about 15 stage tasks and
        # the stream's overflow lane takes turns beside them, so at most about 150 interactive ones
        # pass (10 in a run here). In strict order the load waited for the stream to pause: 1,034.
        assert streamed_meanwhile < 250
    finally:
        stop.set()
        thread.join(30)
        catalog.delete_kb(streamer.tenant_id, streamer.kb_id)
        catalog.delete_kb(loader.tenant_id, loader.kb_id)

"""The sync engine on the real stores (OpenSearch, Redis, the ingestor), driven by connectors of the
test's own: what a run does when a connector raises what it did not type, when two items of a source
name one document, and what a removal deletes after a run died before writing its items down.

The test holds each source's run lease, so the stack's own sync runner leaves its runs alone."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, cast

import pytest

from shared.errors import ErrorCode, RaglineError, TransientError
from shared.models import DocStatus, Document, ErrorInfo, KnowledgeBase
from shared.registry import Registry
from shared.sources.models import ItemOutcome, ItemState, RunStatus, Source, SyncRun, Trigger
from shared.sources.store import SourceStore
from shared.wiring import Services
from tests.integration.helpers import new_kb, share_source, wait_terminal
from workers import leader
from workers.sources import runner, sync
from workers.sources.connector import Connector, Found, Gone
from workers.sources.runner import lease_key
from workers.sources.sync import Stopped, SyncEngine

pytestmark = pytest.mark.integration

ME = f"{socket.gethostname()}:{os.getpid()}"  # a live holder: no runner takes the lease over


class Died(BaseException):
    """The worker process ended in the middle of the listing (nothing after it runs)."""


@dataclass
class Listing(Connector):
    """Items given by the test; `then` is raised once they are listed, `unreadable` fail to read."""

    items: list[Found]
    then: BaseException | None = None
    unreadable: tuple[str, ...] = ()

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        yield from self.items
        if self.then is not None:
            raise self.then

    def read(self, item: Found) -> bytes:
        if item.key in self.unreadable:
            raise OSError(5, "Input/output error")
        return f"the content of {item.key}".encode()


def _item(key: str, doc_id: str | None = None, content: str | None = None) -> Found:
    return Found(
        key=key,
        uri=f"file:///share/{key}",
        version=f"v-{content or key}",
        doc_id=doc_id or key,
        filename=key,
        content=content.encode() if content is not None else None,
    )


@dataclass
class Case:
    services: Services
    kb: KnowledgeBase
    source: Source

    def queued(self, trigger: Trigger = "manual", retry_failed: bool = False) -> SyncRun:
        run = SyncRun(
            run_id=uuid.uuid4().hex,
            tenant_id=self.kb.tenant_id,
            kb_id=self.kb.kb_id,
            source_id=self.source.source_id,
            trigger=trigger,
            retry_failed=retry_failed,
        )
        self.services.source_store.create_run(run)
        return run

    def run(
        self,
        connector: Connector,
        trigger: Trigger = "manual",
        max_items: int = 1000,
        *,
        retry_failed: bool = False,
    ) -> SyncRun:
        queued = self.queued(trigger, retry_failed)
        return self.engine(lambda _: connector, max_items).run(queued, lambda: True)

    def fail(self, doc_id: str) -> Document:
        """The document failed as an outage past its retries leaves it."""
        registry = self.services.registry
        current = registry.require_doc(self.kb.tenant_id, self.kb.kb_id, doc_id)
        lost = ErrorInfo(code="RETRIES_EXHAUSTED", stage="embed", message="Redis was gone")
        update = {"status": DocStatus.FAILED, "error": lost}
        return registry.replace_doc(current, current.doc.model_copy(update=update)).doc

    def engine(self, connector_for: Callable[[Source], Connector], max_items: int = 1000) -> SyncEngine:
        services = self.services
        return SyncEngine(
            services.source_store, services.registry, services.ingestor, connector_for, 1.0, max_items
        )

    def live(self) -> dict[str, DocStatus]:
        found = self.services.registry.source_documents(
            self.kb.tenant_id, self.kb.kb_id, self.source.source_id
        )
        return {doc_id: status for doc_id, status in found.items() if status not in _ABSENT}


_ABSENT = (DocStatus.DELETED, DocStatus.DELETING)


@pytest.fixture
def case(services: Services, registry: Registry) -> Iterator[Case]:
    kb = new_kb(registry)
    source = share_source(kb)
    services.source_store.create(source)
    probe = SyncRun(run_id="probe", tenant_id=kb.tenant_id, kb_id=kb.kb_id, source_id=source.source_id)
    key = lease_key(probe)
    assert leader.hold(services.redis, key, ME, 600)
    try:
        yield Case(services, kb, source)
    finally:
        scope = (kb.tenant_id, kb.kb_id, source.source_id)
        active = services.source_store.active_run(*scope)
        if active is not None:
            services.sources.cancel(active)
        services.source_store.drop_kb(kb.tenant_id, kb.kb_id)
        services.redis.delete(key)


def test_a_listing_that_raises_an_untyped_exception_fails_the_run_and_deletes_nothing(case: Case) -> None:
    first = case.run(Listing([_item("a.txt"), _item("b.txt")]))
    assert first.status == RunStatus.SUCCEEDED
    assert first.counts["created"] == 2
    # A connector's bug, or input nobody foresaw (urljoin's ValueError on a link "http://[x"):
    # it used to escape the engine, leaving the run running, retried for ever before any other.
    broken = case.run(Listing([_item("a.txt")], then=ValueError("Invalid IPv6 URL")))
    assert broken.status == RunStatus.FAILED
    assert broken.error is not None
    assert broken.error.code == "INTERNAL"
    assert set(case.live()) == {"a.txt", "b.txt"}


def test_an_item_that_raises_an_untyped_exception_fails_alone(case: Case) -> None:
    run = case.run(Listing([_item("a.txt"), _item("b.txt")], unreadable=("a.txt",)))
    assert run.status == RunStatus.COMPLETED_WITH_ERRORS
    assert (run.counts["created"], run.counts["failed"]) == (1, 1)
    assert [(f.key, f.code) for f in run.failures] == [("a.txt", "INTERNAL")]


def test_two_items_that_name_one_document_never_delete_it_while_one_is_listed(case: Case) -> None:
    # "a b.txt" and "a-b.txt" are both document "a-b.txt" (as are a page linked as "sub/" and as
    # "sub/index.html"): the first listed keeps it, the other fails CONFLICT instead of replacing it.
    both = [_item("a b.txt", "a-b.txt", "spaced"), _item("a-b.txt", "a-b.txt", "dashed")]
    first = case.run(Listing(both))
    assert first.status == RunStatus.COMPLETED_WITH_ERRORS
    assert (first.counts["created"], first.counts["failed"]) == (1, 1)
    assert [(f.key, f.code) for f in first.failures] == [("a-b.txt", "CONFLICT")]
    # "a b.txt" is gone at the source; "a-b.txt", still there, takes the document over. Deleting the
    # gone item's document deleted the live one's too.
    second = case.run(Listing([_item("a-b.txt", "a-b.txt", "dashed")]))
    assert second.status == RunStatus.SUCCEEDED
    # Nothing was deleted, and the run no longer says it deleted one.
    assert (second.counts["updated"], second.counts["deleted"]) == (1, 0)
    assert set(case.live()) == {"a-b.txt"}


def test_items_that_only_ever_failed_are_none_of_the_sources_documents(case: Case) -> None:
    """Two items whose ids uploads hold failed CONFLICT. Gone from the listing, they counted as
    documents the run would delete: "would delete 2 of the source's 3 documents", the run failed
    and the source's deletions were held, though it would delete nothing. Let through, the run
    said "deleted 2" and deleted nothing."""
    kb = case.kb
    for name in ("u1.txt", "u2.txt"):
        case.services.ingestor.submit(kb.tenant_id, kb.kb_id, b"an upload", filename=name, doc_id=name)
    first = case.run(Listing([_item("p.txt"), _item("u1.txt"), _item("u2.txt")]))
    assert (first.status, first.counts["created"], first.counts["failed"]) == (
        RunStatus.COMPLETED_WITH_ERRORS,
        1,
        2,
    )

    second = case.run(Listing([_item("p.txt")]))

    assert second.status == RunStatus.SUCCEEDED, second.error
    assert (second.counts["deleted"], second.counts["unchanged"]) == (0, 1)
    for name in ("u1.txt", "u2.txt"):
        upload = case.services.registry.require_doc(kb.tenant_id, kb.kb_id, name).doc
        assert (upload.source_id, upload.status in _ABSENT) == (None, False)
    scope = (kb.tenant_id, kb.kb_id, case.source.source_id)
    assert not case.services.source_store.get(*scope).deletions_held


def test_other_names_of_one_document_do_not_make_the_source_look_bigger(case: Case) -> None:
    """Three names of document k.txt failed CONFLICT (the first listed owns it). Counted as items,
    they made 3 of 4 documents read as 3 of 7, and the run deleted three quarters of the source."""
    names = [_item("k.txt"), *(_item(f"k{n}.txt", "k.txt", f"alias {n}") for n in range(3))]
    docs = [_item(f"d{n}.txt") for n in range(3)]
    first = case.run(Listing([*docs, *names]))
    assert (first.counts["created"], first.counts["failed"]) == (4, 3)

    second = case.run(Listing(names))

    assert second.status == RunStatus.FAILED
    assert second.error is not None
    assert "3 of the source's 4 documents" in second.error.message
    assert set(case.live()) == {"d0.txt", "d1.txt", "d2.txt", "k.txt"}
    # One name of k.txt gone, the others still listed: nothing is deleted, nor counted as deleted.
    third = case.run(Listing([*docs, *names[:-1]]))
    assert third.counts["deleted"] == 0, third.counts
    assert "k.txt" in case.live()


def test_a_document_that_failed_fails_each_run_until_its_item_changes(case: Case) -> None:
    """The pipeline failed a file's document after the run had ended. The unchanged file was never
    looked at again: every later run said `succeeded`, and only the document list showed it."""
    kb, blank = case.kb, _item("blank.txt", content=" \n\n ")
    first = case.run(Listing([_item("a.txt"), blank]))
    assert (first.status, first.counts["created"]) == (RunStatus.SUCCEEDED, 2)
    failed = wait_terminal(case.services.registry, kb, ["a.txt", "blank.txt"])["blank.txt"]
    assert (failed.status, failed.error and failed.error.code) == (DocStatus.FAILED, "EMPTY_DOCUMENT")

    for _ in range(2):
        again = case.run(Listing([_item("a.txt"), blank]))
        assert again.status == RunStatus.COMPLETED_WITH_ERRORS
        assert (again.counts["unchanged"], again.counts["failed"]) == (1, 1)
        assert [(f.key, f.code) for f in again.failures] == [("blank.txt", "EMPTY_DOCUMENT")]
        assert "the document failed in " in again.failures[0].message
        assert "reingest" in again.failures[0].message
    # The file touched (a new version, the same bytes): submitted, found unchanged, still failed.
    # It read `unchanged`, and the run `succeeded`.
    touched = replace(blank, version="v-touched")
    for _ in range(2):
        again = case.run(Listing([_item("a.txt"), touched]))
        assert (again.status, again.counts["failed"]) == (RunStatus.COMPLETED_WITH_ERRORS, 1)
    # Its bytes are not worked on again: the same bytes would fail the same way.
    now = case.services.registry.require_doc(kb.tenant_id, kb.kb_id, "blank.txt").doc
    assert now.content_version == failed.content_version
    mended = case.run(Listing([_item("a.txt"), _item("blank.txt", content="text at last")]))
    assert mended.status == RunStatus.SUCCEEDED
    assert (mended.counts["unchanged"], mended.counts["updated"]) == (1, 1)


def test_a_failure_is_not_retried_by_each_run_and_a_reingest_clears_it(case: Case) -> None:
    """A failure a retry might mend (the pipeline's retries ran out) is retried by a reingest, not
    by every run: a parse that outlasts its timeout, every time, held a worker for the whole
    timeout in each run, and each run said `succeeded`."""
    kb, registry = case.kb, case.services.registry
    assert case.run(Listing([_item("a.txt")])).counts["created"] == 1
    done = wait_terminal(registry, kb, ["a.txt"])["a.txt"]
    assert done.status == DocStatus.READY
    current = registry.require_doc(kb.tenant_id, kb.kb_id, "a.txt")
    lost = ErrorInfo(code="RETRIES_EXHAUSTED", stage="embed", message="Redis was gone")
    registry.replace_doc(current, current.doc.model_copy(update={"status": DocStatus.FAILED, "error": lost}))

    second = case.run(Listing([_item("a.txt")]))

    assert (second.status, second.counts["failed"]) == (RunStatus.COMPLETED_WITH_ERRORS, 1)
    assert [(f.key, f.code) for f in second.failures] == [("a.txt", "RETRIES_EXHAUSTED")]
    assert registry.require_doc(kb.tenant_id, kb.kb_id, "a.txt").doc.content_version == done.content_version
    case.services.ingestor.reingest(kb.tenant_id, kb.kb_id, "a.txt")
    assert wait_terminal(registry, kb, ["a.txt"])["a.txt"].status == DocStatus.READY
    third = case.run(Listing([_item("a.txt")]))
    assert (third.status, third.counts["unchanged"]) == (RunStatus.SUCCEEDED, 1)


def test_a_run_that_retries_failed_documents_ingests_them_again_in_its_batch(case: Case) -> None:
    """A source's failed documents could only be retried one reingest at a time."""
    kb, registry = case.kb, case.services.registry
    assert case.run(Listing([_item("a.txt"), _item("b.txt")])).counts["created"] == 2
    wait_terminal(registry, kb, ["a.txt", "b.txt"])
    failed = case.fail("a.txt")

    retried = case.run(Listing([_item("a.txt"), _item("b.txt")]), retry_failed=True)

    assert retried.status == RunStatus.SUCCEEDED
    assert (retried.counts["updated"], retried.counts["unchanged"], retried.counts["failed"]) == (1, 1, 0)
    again = wait_terminal(registry, kb, ["a.txt"])["a.txt"]
    assert (again.status, again.batch_id) == (DocStatus.READY, retried.run_id)
    assert again.content_version == failed.content_version + 1

    # An incremental listing that does not name it retries it too.
    case.fail("a.txt")
    untouched = case.run(Changes([]), retry_failed=True)
    assert (untouched.status, untouched.counts["updated"], untouched.counts["unchanged"]) == (
        RunStatus.SUCCEEDED,
        1,
        1,
    )
    assert wait_terminal(registry, kb, ["a.txt"])["a.txt"].status == DocStatus.READY


def test_a_retry_run_resumed_after_its_worker_died_retries_each_document_once(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resumed, it retried again what the dead attempt had retried and failed again meanwhile,
    and counted `unchanged` what was still queued: 300 retried, 294 counted, two twice."""
    kb, registry, ingestor = case.kb, case.services.registry, case.services.ingestor
    names = ["a.txt", "b.txt", "c.txt"]
    assert case.run(Listing([_item(name) for name in names])).counts["created"] == 3
    wait_terminal(registry, kb, names)
    before = {name: case.fail(name).content_version for name in names}
    run = case.queued(retry_failed=True)
    reingest, calls = ingestor.reingest, []

    def reingest_then_die(tenant_id: str, kb_id: str, doc_id: str, *, batch_id: str | None = None) -> object:
        done = reingest(tenant_id, kb_id, doc_id, batch_id=batch_id)
        calls.append(doc_id)
        if len(calls) == 2:
            raise Died
        return done

    monkeypatch.setattr(ingestor, "reingest", reingest_then_die)
    with pytest.raises(Died):
        case.engine(lambda _: Listing([_item(name) for name in names])).run(run, lambda: True)
    monkeypatch.undo()
    wait_terminal(registry, kb, calls)
    case.fail(calls[0])  # the pipeline failed it again before the run was resumed

    resumed = case.engine(lambda _: Listing([_item(name) for name in names])).run(run, lambda: True)

    assert resumed.counts["updated"] == 3
    now = {name: registry.require_doc(kb.tenant_id, kb.kb_id, name).doc.content_version for name in names}
    assert now == {name: version + 1 for name, version in before.items()}
    assert len(registry.source_documents(kb.tenant_id, kb.kb_id, "share", resumed.run_id)) == 3


@pytest.mark.parametrize("call", ["submit", "reingest"])
def test_a_run_waits_out_a_full_queue_and_sends_each_document_once(
    case: Case, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A 429 from the tenant's admission is waited out as a client would, for a new item's submit
    and for a retried document's reingest alike."""
    kb, ingestor = case.kb, case.services.ingestor
    if call == "reingest":
        assert case.run(Listing([_item("a.txt")])).counts["created"] == 1
        wait_terminal(case.services.registry, kb, ["a.txt"])
        case.fail("a.txt")
    send, calls = getattr(ingestor, call), []

    def full_once(*args: object, **kwargs: object) -> object:
        calls.append(call)
        if len(calls) == 1:
            raise RaglineError(
                "the queue is full", code=ErrorCode.RATE_LIMITED, details={"retry_after": 0.05}
            )
        return send(*args, **kwargs)

    monkeypatch.setattr(ingestor, call, full_once)
    run = case.run(Listing([_item("a.txt")]), retry_failed=call == "reingest")
    assert (run.status, run.counts["created" if call == "submit" else "updated"]) == (RunStatus.SUCCEEDED, 1)
    assert len(calls) == 2


def _always_full(ingestor: object, monkeypatch: pytest.MonkeyPatch, after: int = 0) -> list[str]:
    """The tenant's queue full (429) for every submit after the first `after`; the calls made."""
    send, calls = ingestor.submit, []  # type: ignore[attr-defined]

    def full(*args: object, **kwargs: object) -> object:
        calls.append("submit")
        if len(calls) > after:
            raise RaglineError("the queue is full", code=ErrorCode.RATE_LIMITED, details={"retry_after": 0.3})
        return send(*args, **kwargs)

    monkeypatch.setattr(ingestor, "submit", full)
    return calls


def _in_background(call: Callable[[], SyncRun]) -> tuple[Future[SyncRun], ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(1)
    return pool.submit(call), pool


def test_a_run_waiting_out_a_full_queue_stops_once_cancelled(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for admission asked nothing: a cancelled run went on waiting (and holding its
    runner) until its tenant's queue had room."""
    calls = _always_full(case.services.ingestor, monkeypatch)
    run = case.queued()
    engine = case.engine(lambda _: Listing([_item("a.txt")]))
    waiting, pool = _in_background(lambda: engine.run(run, lambda: True))
    try:
        while len(calls) < 2:
            assert not waiting.done(), waiting
            threading.Event().wait(0.05)
        case.services.sources.cancel(run)
        with pytest.raises(Stopped) as stopped:
            waiting.result(timeout=30)
        assert type(stopped.value) is Stopped  # nobody else waits: it did not make way
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def test_a_run_held_by_its_full_queue_makes_way_for_another_tenants_then_goes_on(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sync, "MAKE_WAY_AFTER_S", 1.0)
    ingestor, store = case.services.ingestor, case.services.source_store
    send = ingestor.submit
    calls = _always_full(ingestor, monkeypatch, after=1)
    items = [_item("a.txt"), _item("b.txt")]
    run = case.queued()
    engine = case.engine(lambda _: Listing(items))
    asked: list[bool] = []

    def others_wait() -> bool:
        asked.append(True)
        return True

    with pytest.raises(sync.MadeWay):
        engine.run(run, lambda: True, others_wait)
    assert asked  # only once it had waited MAKE_WAY_AFTER_S
    assert len(calls) >= 4
    made_way = _stored(case, run)
    assert made_way.status == RunStatus.RUNNING  # still the source's run, to be resumed
    assert made_way.attempts == run.attempts  # no failed attempt: its retries after errors stay
    assert store.known(case.kb.tenant_id, case.kb.kb_id, "share")["a.txt"].run_id == run.run_id
    monkeypatch.setattr(ingestor, "submit", send)
    resumed = engine.run(made_way, lambda: True)
    assert (resumed.status, resumed.counts["created"]) == (RunStatus.SUCCEEDED, 2)


def test_an_incremental_retry_stopped_while_waiting_writes_down_what_it_retried(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped among the items its listing did not name, a run wrote none of them down."""
    kb, registry, ingestor = case.kb, case.services.registry, case.services.ingestor
    names = ["a.txt", "b.txt"]
    assert case.run(Listing([_item(name) for name in names])).counts["created"] == 2
    wait_terminal(registry, kb, names)
    for name in names:
        case.fail(name)
    reingest, calls = ingestor.reingest, []

    def full_after_one(tenant_id: str, kb_id: str, doc_id: str, *, batch_id: str | None = None) -> object:
        calls.append(doc_id)
        if len(calls) > 1:
            raise RaglineError("the queue is full", code=ErrorCode.RATE_LIMITED, details={"retry_after": 0.3})
        return reingest(tenant_id, kb_id, doc_id, batch_id=batch_id)

    monkeypatch.setattr(ingestor, "reingest", full_after_one)
    run = case.queued(retry_failed=True)

    def may_go_on() -> bool:
        return len(calls) < 3  # stopped once it waited for the second document

    with pytest.raises(Stopped):
        case.engine(lambda _: Changes([])).run(run, may_go_on)
    known = case.services.source_store.known(kb.tenant_id, kb.kb_id, "share")
    assert (known[calls[0]].run_id, known[calls[0]].outcome) == (run.run_id, ItemOutcome.UPDATED)


def test_the_waits_of_a_whole_run_count_toward_making_way(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queue that made room for one document every few seconds kept no document waiting long,
    and the run never made way: another tenant's run waited until it had ended (113 s)."""
    monkeypatch.setattr(sync, "MAKE_WAY_AFTER_S", 1.0)
    ingestor = case.services.ingestor
    send, calls = ingestor.submit, []

    def room_every_other_call(*args: Any, **kwargs: Any) -> object:
        calls.append("submit")
        if len(calls) % 2 == 0:
            raise RaglineError("the queue is full", code=ErrorCode.RATE_LIMITED, details={"retry_after": 0.3})
        return send(*args, **kwargs)

    monkeypatch.setattr(ingestor, "submit", room_every_other_call)
    engine = case.engine(lambda _: Listing([_item(f"{n}.txt") for n in range(8)]))
    with pytest.raises(sync.MadeWay):
        engine.run(case.queued(), lambda: True, lambda: True)
    assert 4 < len(calls) < 16  # it waited once per document, and made way before the last


def test_a_run_makes_way_only_for_another_tenants_run_that_no_runner_holds(case: Case) -> None:
    def run_of(tenant_id: str) -> SyncRun:
        return SyncRun(run_id=uuid.uuid4().hex, tenant_id=tenant_id, kb_id="kb", source_id="s")

    mine, same, other = run_of(case.kb.tenant_id), run_of(case.kb.tenant_id), run_of("t-another")

    class Listed(_Only):
        def pending_runs(self) -> list[list[SyncRun]]:
            return [listed]

    store = cast(SourceStore, Listed(case.services.source_store, set()))
    sync_runner = runner.SyncRunner(case.services.redis, ME, lambda: case.services, 600)
    listed = [mine, same]
    assert not sync_runner._others_wait(store, mine)
    listed = [mine, other]
    assert sync_runner._others_wait(store, mine)
    assert leader.hold(case.services.redis, lease_key(other), "another-worker", 600)
    try:
        assert not sync_runner._others_wait(store, mine)  # another runner has it
    finally:
        case.services.redis.delete(lease_key(other))
    sync_runner._made_way[other.run_id] = time.monotonic()
    assert not sync_runner._others_wait(store, mine)  # it just made way itself: no handing back


@dataclass
class Changes(Listing):
    """An incremental listing (as git's): it names what changed, and items it does not name are
    as they were."""

    incremental = True


def test_an_incremental_run_counts_a_failed_document_it_does_not_list(case: Case) -> None:
    kb = case.kb
    first = case.run(Listing([_item("a.txt"), _item("blank.txt", content=" \n ")]))
    assert first.counts["created"] == 2
    assert wait_terminal(case.services.registry, kb, ["blank.txt"])["blank.txt"].status == DocStatus.FAILED

    second = case.run(Changes([_item("b.txt")]))

    assert second.status == RunStatus.COMPLETED_WITH_ERRORS
    assert (second.counts["created"], second.counts["unchanged"], second.counts["failed"]) == (1, 1, 1)
    assert [(f.key, f.code) for f in second.failures] == [("blank.txt", "EMPTY_DOCUMENT")]
    assert second.listed == 3


def test_a_run_whose_kb_is_deleted_under_it_stops(case: Case) -> None:
    """Its records went with the KB; writing its outcome failed NOT_FOUND, logged as a fault of
    the engine (ERROR "failed unexpectedly", then "could not be ended")."""
    kb = case.kb

    @dataclass
    class DeletedMidway(Listing):
        def scan(
            self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
        ) -> Iterator[Found | Gone]:
            yield self.items[0]
            case.services.source_store.drop_kb(kb.tenant_id, kb.kb_id)
            yield from self.items[1:]

    with pytest.raises(Stopped):
        case.run(DeletedMidway([_item("a.txt"), _item("b.txt")]))
    # What it wrote down after its KB went (the listing's last page) went too.
    assert case.services.source_store.known(kb.tenant_id, kb.kb_id, case.source.source_id) == {}


@pytest.mark.parametrize("meanwhile", ["cancelled", "kb deleted"])
def test_a_removal_deletes_no_more_once_cancelled_or_its_kb_is_gone(
    case: Case, monkeypatch: pytest.MonkeyPatch, meanwhile: str
) -> None:
    """A DELETE with keep_documents cancels the removal under way and answers that the documents
    stay: the removal went on deleting them until a write of its own failed. With its KB deleted,
    it logged a fault of the engine, twice."""
    kb, ingestor = case.kb, case.services.ingestor
    items = [_item(f"{n}.txt") for n in range(4)]
    assert case.run(Listing(items)).counts["created"] == 4
    wait_terminal(case.services.registry, kb, [item.doc_id for item in items])
    removal = case.queued("remove")
    delete, deleted = ingestor.delete, []

    def delete_then(tenant_id: str, kb_id: str, doc_id: str) -> Document:
        done = delete(tenant_id, kb_id, doc_id)
        deleted.append(doc_id)
        if len(deleted) == 1 and meanwhile == "cancelled":
            case.services.sources.cancel(removal)
        elif len(deleted) == 1:
            case.services.source_store.drop_kb(kb.tenant_id, kb.kb_id)
        return done

    monkeypatch.setattr(ingestor, "delete", delete_then)
    with pytest.raises(Stopped):
        case.engine(lambda _: Listing([])).run(removal, lambda: True)
    assert len(deleted) == 1
    assert len(case.live()) == 3


def test_a_run_deleted_after_it_was_listed_is_passed_over(case: Case) -> None:
    """Listed as pending, then deleted with its source: the runner's round failed on it."""
    ghost = SyncRun(
        run_id=uuid.uuid4().hex, tenant_id=case.kb.tenant_id, kb_id=case.kb.kb_id, source_id="share"
    )

    class Listed(_Only):
        def pending_runs(self) -> list[list[SyncRun]]:
            return [[ghost]]

    store = cast(SourceStore, Listed(case.services.source_store, set()))
    sync_runner = runner.SyncRunner(
        case.services.redis, ME, lambda: replace(case.services, source_store=store), 600
    )
    assert not sync_runner.run_pending()


def test_a_removal_deletes_the_documents_of_a_run_that_died_before_writing_its_items(case: Case) -> None:
    with pytest.raises(Died):
        case.run(Listing([_item("a.txt"), _item("b.txt")], then=Died()))
    assert set(case.live()) == {"a.txt", "b.txt"}  # submitted, with no item written down
    scope = (case.kb.tenant_id, case.kb.kb_id, case.source.source_id)
    assert case.services.source_store.known(*scope) == {}
    died = case.services.source_store.active_run(*scope)
    assert died is not None
    case.services.sources.cancel(died)  # as a removal does to the source's active run
    removal = case.run(Listing([]), trigger="remove")
    assert removal.status == RunStatus.SUCCEEDED
    assert case.live() == {}


def test_an_upload_that_took_a_gone_items_id_is_not_deleted_by_the_source(case: Case) -> None:
    first = case.run(Listing([_item("u.txt"), _item("v.txt")]))
    assert first.counts["created"] == 2
    kb = case.kb
    # The user deletes the source's document by hand and uploads one of their own under its id
    # (free again: a deleted document belongs to nobody).
    case.services.ingestor.delete(kb.tenant_id, kb.kb_id, "u.txt")
    case.services.ingestor.submit(kb.tenant_id, kb.kb_id, b"my own upload", filename="u.txt", doc_id="u.txt")
    # u.txt is gone at the source: the source forgets it, and leaves the upload alone.
    second = case.run(Listing([_item("v.txt")]))
    assert second.status == RunStatus.SUCCEEDED
    upload = case.services.registry.require_doc(kb.tenant_id, kb.kb_id, "u.txt").doc
    assert upload.source_id is None
    assert upload.status not in _ABSENT


def test_a_listing_over_the_item_limit_fails_too_large_and_deletes_nothing(case: Case) -> None:
    """RAGLINE_SOURCES__MAX_ITEMS: a source that grew past it keeps what it had, with a clear code."""
    first = case.run(Listing([_item("a.txt"), _item("b.txt")]), max_items=3)
    assert (first.status, first.counts["created"]) == (RunStatus.SUCCEEDED, 2)
    grown = case.run(Listing([_item(f"{n}.txt") for n in range(5)]), max_items=3)
    assert grown.status == RunStatus.FAILED
    assert grown.error is not None
    assert grown.error.code == "TOO_LARGE"
    assert "RAGLINE_SOURCES__MAX_ITEMS" in grown.error.message
    assert {"a.txt", "b.txt"} <= set(case.live()), "a failed run deleted what it did not list"


def test_a_run_whose_source_went_with_its_kb_ends_instead_of_failing_every_round(case: Case) -> None:
    """A KB deleted while its source's run waited (or a claim rewrote the run after the delete)
    left a run without a source; the engine raised on it, and every runner picked it first again."""
    run = case.queued("remove")
    store = case.services.source_store
    store.drop_kb(case.kb.tenant_id, case.kb.kb_id)
    store.create_run(run)  # as a claim's update written after the delete would leave it
    ended = case.engine(lambda _: Listing([])).run(run, lambda: True)
    assert ended.status == RunStatus.CANCELLED
    assert ended.error is not None
    assert ended.error.code == "NOT_FOUND"
    assert run.run_id not in {r.run_id for runs in store.pending_runs() for r in runs}


class _Only:
    """The source store, listing only the given runs as pending: the stack's other runs stay out."""

    def __init__(self, store: SourceStore, run_ids: set[str]) -> None:
        self._store, self._run_ids = store, run_ids

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def pending_runs(self) -> list[list[SyncRun]]:
        return [[r for r in runs if r.run_id in self._run_ids] for runs in self._store.pending_runs()]


def _runner_over(
    case: Case, monkeypatch: pytest.MonkeyPatch, run: SyncRun, error: Exception, *, fail_too: bool = False
) -> runner.SyncRunner:
    """A sync runner that sees only `run`, over an engine that raises `error` (and, with
    `fail_too`, raises again when asked to end the run failed)."""

    class Faulty(SyncEngine):
        def run(
            self, run: SyncRun, may_go_on: Callable[[], bool], others_wait: Callable[[], bool] = bool
        ) -> SyncRun:
            raise error

        def fail(self, run: SyncRun, error: Exception) -> SyncRun:
            if fail_too:
                raise ValueError("the run's records are what broke")
            return super().fail(run, error)

    def faulty(services: Services) -> SyncEngine:
        listing = Listing([])
        return Faulty(services.source_store, services.registry, services.ingestor, lambda _: listing, 1.0, 9)

    monkeypatch.setattr(runner, "engine_of", faulty)
    store = case.services.source_store
    services = replace(case.services, source_store=cast(SourceStore, _Only(store, {run.run_id})))
    return runner.SyncRunner(case.services.redis, ME, lambda: services, 600)


def _stored(case: Case, run: SyncRun) -> SyncRun:
    return case.services.source_store.get_run(
        case.kb.tenant_id, case.kb.kb_id, case.source.source_id, run.run_id
    )


def test_a_run_the_engine_fails_on_unexpectedly_ends_failed_and_the_runner_goes_on(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception nothing typed escaped the engine: the runner's round failed, and the run, still
    pending, was claimed first and failed again in every round after it."""
    run = case.queued()
    sync_runner = _runner_over(case, monkeypatch, run, ValueError("a fault of the engine"))
    assert sync_runner.run_pending()
    ended = _stored(case, run)
    assert ended.status == RunStatus.FAILED
    assert ended.error is not None
    assert ended.error.code == "INTERNAL"
    assert case.services.source_store.get(case.kb.tenant_id, case.kb.kb_id, case.source.source_id).last_run
    assert not sync_runner.run_pending()


def test_a_retryable_failure_is_tried_again_and_ends_the_run_only_after_its_attempts(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = case.queued()
    sync_runner = _runner_over(case, monkeypatch, run, TransientError("the blob store is busy"))
    with pytest.raises(TransientError):
        sync_runner.run_pending()  # the round fails and waits; the run stays to be tried again
    # The failed round let go of the run's lease: take it back before the stack's own runner, which
    # the round's end may wake, claims the run and ends it with its real engine.
    assert leader.hold(case.services.redis, lease_key(run), ME, 600)
    assert _stored(case, run).status.active
    store = case.services.source_store
    store.update_run(run.run_id, lambda r: r.model_copy(update={"attempts": runner.RUN_ATTEMPTS - 1}))
    assert sync_runner.run_pending()
    assert _stored(case, run).status == RunStatus.FAILED


def test_a_run_that_cannot_even_be_ended_is_marked_failed(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = case.queued()
    sync_runner = _runner_over(case, monkeypatch, run, ValueError("a fault"), fail_too=True)
    assert sync_runner.run_pending()
    ended = _stored(case, run)
    assert ended.status == RunStatus.FAILED
    assert not sync_runner.run_pending()


def test_a_run_that_made_way_is_taken_after_the_others_next_time(
    case: Case, services: Services, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fair order's turn came round to the tenant that had just made way every other round,
    and the other tenant's run waited another MAKE_WAY_AFTER_S."""
    other_kb = new_kb(registry)
    other = share_source(other_kb)
    services.source_store.create(other)
    theirs = SyncRun(run_id=uuid.uuid4().hex, tenant_id=other_kb.tenant_id, kb_id="kb", source_id="share")
    services.source_store.create_run(theirs)
    assert leader.hold(services.redis, lease_key(theirs), ME, 600)  # the stack's runner leaves it
    mine = case.queued()
    ran: list[str] = []

    class MakesWay(SyncEngine):
        def run(
            self, run: SyncRun, may_go_on: Callable[[], bool], others_wait: Callable[[], bool] = bool
        ) -> SyncRun:
            ran.append(run.run_id)
            raise sync.MadeWay(run.run_id)

    def makes_way(services: Services) -> SyncEngine:
        return MakesWay(
            services.source_store, services.registry, services.ingestor, lambda _: Listing([]), 1.0, 9
        )

    monkeypatch.setattr(runner, "engine_of", makes_way)
    monkeypatch.setattr(runner, "fair_order", lambda _, __: [mine, theirs])  # its tenant's turn, twice
    store = cast(SourceStore, _Only(services.source_store, {mine.run_id, theirs.run_id}))
    sync_runner = runner.SyncRunner(services.redis, ME, lambda: replace(services, source_store=store), 600)
    try:
        assert sync_runner.run_pending()
        assert sync_runner.run_pending()
        assert ran == [mine.run_id, theirs.run_id]
    finally:
        services.sources.cancel(theirs)
        services.source_store.drop_kb(other_kb.tenant_id, other_kb.kb_id)
        services.redis.delete(lease_key(theirs))

"""How a source's runs start (shared/sources/service.py): a sync joins the run under way, with the
options it asks for while that run is queued; and the runs go with their source, whatever
arrives while it goes: a DELETE sent again, a sync whose source was removed (or whose knowledge
base was deleted) between its read and its write. Runs written in those windows outlived the
source, and a new source of the same id listed them.

The records live in indexes of the test's own, which the stack's runners never see; the test runs
the removal itself."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.models import KnowledgeBase
from shared.registry import Registry
from shared.sources.models import RunStatus, Source, SyncRun
from shared.sources.service import Sources
from shared.sources.store import SourceNotFound, SourceStore
from shared.wiring import Services
from tests.integration.helpers import new_kb, share_source
from workers.sources.connector import Connector
from workers.sources.sync import SyncEngine

pytestmark = pytest.mark.integration


@dataclass
class Case:
    sources: Sources
    store: SourceStore
    kb: KnowledgeBase
    source: Source
    engine: SyncEngine

    @property
    def scope(self) -> tuple[str, str, str]:
        return (self.kb.tenant_id, self.kb.kb_id, self.source.source_id)

    def stored_runs(self) -> list[SyncRun]:
        """Every run record of the source's id, whatever its state (a search sees them all once
        refreshed)."""
        self.store.client.indices.refresh(index=self.store.runs)
        return self.store.list_runs(*self.scope, limit=100)


def _no_connector(_: Source) -> Connector:
    raise AssertionError("a removal reads nothing from its source")


@pytest.fixture
def case(services: Services, registry: Registry, own_source_store: SourceStore, settings: Settings) -> Case:
    kb = new_kb(registry)
    sources = Sources(settings, own_source_store, registry, services.redis)
    source = share_source(kb)
    own_source_store.create(source)
    engine = SyncEngine(own_source_store, registry, services.ingestor, _no_connector, 1.0, 1000)
    return Case(sources, own_source_store, kb, source, engine)


def test_a_removal_asked_for_again_joins_the_one_under_way(case: Case) -> None:
    def remove(_: int) -> SyncRun | None:
        return case.sources.remove(*case.scope, keep_documents=False)

    with ThreadPoolExecutor(8) as pool:
        answered = list(pool.map(remove, range(24)))
    runs = {run.run_id for run in answered if run is not None}
    # Each DELETE used to cancel the removal before it and queue its own.
    assert len(runs) == 1
    assert [(run.run_id, run.status) for run in case.stored_runs()] == [(runs.pop(), RunStatus.QUEUED)]


def test_a_delete_sent_as_the_removal_ends_leaves_no_run_behind(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    removal = case.sources.remove(*case.scope, keep_documents=False)
    assert removal is not None
    delete_source = case.store.delete
    late: list[SyncRun | None] = []

    def delete_after_another_delete(tenant_id: str, kb_id: str, source_id: str) -> None:
        # The removal's run has ended; its source is still there for a moment.
        late.append(case.sources.remove(tenant_id, kb_id, source_id, keep_documents=False))
        delete_source(tenant_id, kb_id, source_id)

    monkeypatch.setattr(case.store, "delete", delete_after_another_delete)
    ended = case.engine.run(removal, lambda: True)
    assert ended.status == RunStatus.SUCCEEDED
    [again] = late
    assert again is not None
    assert again.run_id != removal.run_id  # a run of its own, which the removal's sweep took
    with pytest.raises(SourceNotFound):
        case.store.get(*case.scope)
    assert case.stored_runs() == []


def _removed(case: Case) -> None:
    case.store.delete(*case.scope)


def _kb_deleted(case: Case) -> None:
    case.sources.registry.delete_kb(case.kb.tenant_id, case.kb.kb_id)


def _being_removed(case: Case) -> None:
    case.store.update(*case.scope, lambda s: s.model_copy(update={"deleting": True}))


@pytest.mark.parametrize(
    ("meanwhile", "code"),
    [
        (_removed, ErrorCode.NOT_FOUND),
        (_kb_deleted, ErrorCode.NOT_FOUND),
        (_being_removed, ErrorCode.CONFLICT),
    ],
)
def test_a_sync_whose_source_went_after_it_was_read_takes_its_run_back(
    case: Case, meanwhile: Callable[[Case], None], code: ErrorCode
) -> None:
    read = case.store.get(*case.scope)
    meanwhile(case)
    with pytest.raises(RaglineError) as refused:
        case.sources.start(read, "manual")
    assert refused.value.code == code
    assert case.stored_runs() == []


def test_a_sync_joins_the_queued_run_with_its_options_and_is_refused_on_a_running_one(case: Case) -> None:
    queued = case.sources.sync(*case.scope)
    joined = case.sources.sync(*case.scope, retry_failed=True)
    assert (joined.run_id, joined.retry_failed, joined.allow_deletions) == (queued.run_id, True, False)
    both = case.sources.sync(*case.scope, allow_deletions=True)
    assert (both.run_id, both.retry_failed, both.allow_deletions) == (queued.run_id, True, True)
    assert case.sources.sync(*case.scope).run_id == queued.run_id  # asks nothing: joins as it is

    case.store.update_run(queued.run_id, lambda r: r.model_copy(update={"status": RunStatus.RUNNING}))
    case.store.update_run(queued.run_id, lambda r: r.model_copy(update={"retry_failed": False}))
    with pytest.raises(RaglineError) as refused:
        case.sources.sync(*case.scope, retry_failed=True)
    assert refused.value.code == ErrorCode.CONFLICT
    assert "without retry_failed" in refused.value.message


def test_keeping_the_documents_is_refused_while_a_removal_deletes_them(case: Case) -> None:
    """It answered 204, "the documents stay", while the removal went on deleting them."""
    removal = case.sources.remove(*case.scope, keep_documents=False)
    assert removal is not None
    with pytest.raises(RaglineError) as refused:
        case.sources.remove(*case.scope, keep_documents=True)
    assert refused.value.code == ErrorCode.CONFLICT
    assert removal.run_id in refused.value.message
    assert [(run.run_id, run.status) for run in case.stored_runs()] == [(removal.run_id, RunStatus.QUEUED)]
    assert case.store.get(*case.scope).deleting

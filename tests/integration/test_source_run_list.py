"""A source's run list agrees with the run itself: a run's end is visible to a GET before a
search finds it, and the list said `running` for a run that `GET .../runs/{id}` had said ended.
The records live in indexes of the test's own (another prefix)."""

from __future__ import annotations

import uuid

import pytest

from shared.sources.models import RunStatus, SyncRun
from shared.sources.store import SourceStore

pytestmark = pytest.mark.integration


def test_the_run_list_shows_a_run_ended_once_reading_the_run_does(own_source_store: SourceStore) -> None:
    store = own_source_store
    older = SyncRun(run_id=uuid.uuid4().hex, tenant_id="t", kb_id="kb", source_id="s")
    run = SyncRun(run_id=uuid.uuid4().hex, tenant_id="t", kb_id="kb", source_id="s")
    store.create_run(older)
    store.create_run(run)
    # No refresh from here on: the end is written and not yet searchable, as while its writer
    # waits on refresh=wait_for.
    store.client.indices.put_settings(index=store.runs, body={"index": {"refresh_interval": "-1"}})
    ended = run.model_copy(update={"status": RunStatus.SUCCEEDED, "listed": 3})
    store.client.index(index=store.runs, id=run.run_id, body=ended.model_dump(mode="json"))

    assert store.get_run("t", "kb", "s", run.run_id).status == RunStatus.SUCCEEDED
    listed = {r.run_id: (r.status, r.listed) for r in store.list_runs("t", "kb", "s")}
    assert listed == {run.run_id: (RunStatus.SUCCEEDED, 3), older.run_id: (RunStatus.QUEUED, 0)}

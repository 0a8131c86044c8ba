"""The sources store: sources, their sync runs and what each source remembers of its items, in
OpenSearch beside the registry. It owns every request on those three indexes.

Source and run updates are optimistic (`_seq_no`/`_primary_term`): a change is a function of the
record as read, applied again when another writer got there first, so the API (editing a source,
cancelling a run) and a worker (recording a run's end) never overwrite each other.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from opensearchpy import OpenSearch, helpers
from opensearchpy.exceptions import ConflictError, NotFoundError
from pydantic import BaseModel

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.models import utcnow
from shared.sources.models import (
    MAX_FAILURES_KEPT,
    ItemFailure,
    ItemOutcome,
    ItemState,
    RunStatus,
    Source,
    SyncRun,
)

UPDATE_ATTEMPTS = 8
_PAGE = 1000
ModelT = TypeVar("ModelT", bound=BaseModel)


class SourceNotFound(RaglineError):
    code = ErrorCode.NOT_FOUND


def _keyword() -> dict[str, Any]:
    return {"type": "keyword", "ignore_above": 8191}


_SCOPE = {"tenant_id": {"type": "keyword"}, "kb_id": {"type": "keyword"}, "source_id": {"type": "keyword"}}
SOURCES_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        **_SCOPE,
        "type": {"type": "keyword"},
        "name": {"type": "text", "fields": {"raw": _keyword()}},
        "settings": {"type": "object", "enabled": False},
        "schedule": {"type": "object", "enabled": False},
        "doc_id_prefix": _keyword(),
        "max_deleted_share": {"type": "float"},
        "deletions_held": {"type": "boolean"},
        "deleting": {"type": "boolean"},
        "cursor": {"type": "object", "enabled": False},
        "last_run": {"type": "object", "enabled": False},
        "next_run_at": {"type": "date"},
        "created_at": {"type": "date"},
        "updated_at": {"type": "date"},
    },
}
RUNS_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        **_SCOPE,
        "run_id": {"type": "keyword"},
        "status": {"type": "keyword"},
        "trigger": {"type": "keyword"},
        "allow_deletions": {"type": "boolean"},
        "retry_failed": {"type": "boolean"},
        "attempts": {"type": "integer"},
        "claimed_by": {"type": "keyword"},
        "counts": {"type": "object", "enabled": False},
        "listed": {"type": "integer"},
        "failures": {"type": "object", "enabled": False},
        "error": {"type": "object", "enabled": False},
        "created_at": {"type": "date"},
        "started_at": {"type": "date"},
        "finished_at": {"type": "date"},
        "duration_s": {"type": "float"},
    },
}
ITEMS_MAPPING: dict[str, Any] = {
    "dynamic": "strict",
    "properties": {
        **_SCOPE,
        "key": _keyword(),
        "doc_id": _keyword(),
        "version": {"type": "keyword", "index": False, "doc_values": False},
        "run_id": {"type": "keyword"},
        "outcome": {"type": "keyword"},
        "error": {"type": "object", "enabled": False},
        "extra": {"type": "object", "enabled": False},
    },
}


# What a runner's round reads of the pending runs: enough of each tenant's to pass those that other
# runners hold (one a runner), and enough tenants for the busiest deployment's turns.
PENDING_PER_TENANT = 20
PENDING_TENANTS = 1000


def source_key(tenant_id: str, kb_id: str, source_id: str) -> str:
    return f"{tenant_id}/{kb_id}/{source_id}"


def _item_id(tenant_id: str, kb_id: str, source_id: str, key: str) -> str:
    # Item keys are paths, object keys and URLs of any length; an OpenSearch id holds 512 bytes.
    return hashlib.sha256(f"{tenant_id}/{kb_id}/{source_id}\x00{key}".encode()).hexdigest()


def _scope(tenant_id: str, kb_id: str, source_id: str | None = None) -> list[dict[str, Any]]:
    terms = [{"term": {"tenant_id": tenant_id}}, {"term": {"kb_id": kb_id}}]
    return terms + ([{"term": {"source_id": source_id}}] if source_id is not None else [])


class SourceStore:
    def __init__(self, client: OpenSearch, settings: Settings) -> None:
        self.client = client
        prefix = settings.opensearch.index_prefix
        self.sources, self.runs, self.items = (
            f"{prefix}-sources",
            f"{prefix}-source-runs",
            f"{prefix}-source-items",
        )
        self._index_settings = {
            "number_of_shards": 1,
            "number_of_replicas": settings.opensearch.replicas,
            "refresh_interval": "1s",
        }

    def ensure_indexes(self) -> None:
        """Create the three indexes, or add fields a newer version maps (idempotent)."""
        for name, mapping in (
            (self.sources, SOURCES_MAPPING),
            (self.runs, RUNS_MAPPING),
            (self.items, ITEMS_MAPPING),
        ):
            if self.client.indices.exists(index=name):
                self.client.indices.put_mapping(index=name, body={"properties": mapping["properties"]})
                continue
            body = {"settings": self._index_settings, "mappings": mapping}
            try:
                self.client.indices.create(index=name, body=body)
            except Exception as error:
                if "resource_already_exists_exception" not in str(error):
                    raise

    # sources

    def create(self, source: Source) -> Source:
        key = source_key(source.tenant_id, source.kb_id, source.source_id)
        try:
            self.client.index(
                index=self.sources,
                id=key,
                body=source.model_dump(mode="json"),
                op_type="create",
                refresh="wait_for",
            )
        except ConflictError:
            raise RaglineError(
                f"source '{source.source_id}' already exists in this knowledge base", code=ErrorCode.CONFLICT
            ) from None
        return source

    def get(self, tenant_id: str, kb_id: str, source_id: str) -> Source:
        return self._read(self.sources, source_key(tenant_id, kb_id, source_id), Source)[0]

    def exists(self, tenant_id: str, kb_id: str, source_id: str) -> bool:
        try:
            self.get(tenant_id, kb_id, source_id)
        except SourceNotFound:
            return False
        return True

    def of_kb(self, tenant_id: str, kb_id: str) -> list[Source]:
        """The KB's sources, as a read of each would find them (a source removed a moment ago too)."""
        self.client.indices.refresh(index=self.sources)
        body = {
            "size": 1000,
            "query": {"bool": {"filter": _scope(tenant_id, kb_id)}},
            "sort": [{"source_id": "asc"}],
        }
        hits = self.client.search(index=self.sources, body=body)["hits"]["hits"]
        return [Source.model_validate(hit["_source"]) for hit in hits]

    def update(
        self, tenant_id: str, kb_id: str, source_id: str, change: Callable[[Source], Source]
    ) -> Source:
        return self._update(self.sources, source_key(tenant_id, kb_id, source_id), Source, change)

    def delete(self, tenant_id: str, kb_id: str, source_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.client.delete(
                index=self.sources, id=source_key(tenant_id, kb_id, source_id), refresh="wait_for"
            )

    def drop_kb(self, tenant_id: str, kb_id: str) -> None:
        """Forget every source of a knowledge base, their runs and items (the KB is being deleted;
        its documents go with it)."""
        query = {"bool": {"filter": _scope(tenant_id, kb_id)}}
        for index in (self.runs, self.items, self.sources):
            self._delete_matching(index, query)

    def due(self, now: datetime, limit: int = 100) -> list[Source]:
        """Scheduled sources whose next run is due (not those being deleted)."""
        query = {
            "bool": {
                "filter": [{"range": {"next_run_at": {"lte": now.isoformat()}}}],
                "must_not": [{"term": {"deleting": True}}],
            }
        }
        hits = self.client.search(index=self.sources, body={"size": limit, "query": query})["hits"]["hits"]
        return [Source.model_validate(hit["_source"]) for hit in hits]

    # runs

    def create_run(self, run: SyncRun) -> SyncRun:
        self.client.index(
            index=self.runs,
            id=run.run_id,
            body=run.model_dump(mode="json"),
            op_type="create",
            refresh="wait_for",
        )
        return run

    def delete_run(self, run_id: str) -> None:
        with contextlib.suppress(NotFoundError):
            self.client.delete(index=self.runs, id=run_id, refresh="wait_for")

    def get_run(self, tenant_id: str, kb_id: str, source_id: str, run_id: str) -> SyncRun:
        run = self._read(self.runs, run_id, SyncRun)[0]
        if (run.tenant_id, run.kb_id, run.source_id) != (tenant_id, kb_id, source_id):
            raise SourceNotFound(f"run '{run_id}' not found")
        return run

    def tenant_run(self, tenant_id: str, run_id: str) -> SyncRun | None:
        """The tenant's run of this id, of whichever source; None if it has none."""
        try:
            run = self._read(self.runs, run_id, SyncRun)[0]
        except SourceNotFound:
            return None
        return run if run.tenant_id == tenant_id else None

    def update_run(self, run_id: str, change: Callable[[SyncRun], SyncRun]) -> SyncRun:
        return self._update(self.runs, run_id, SyncRun, change)

    def list_runs(self, tenant_id: str, kb_id: str, source_id: str, limit: int = 20) -> list[SyncRun]:
        body = {
            "size": limit,
            "query": {"bool": {"filter": _scope(tenant_id, kb_id, source_id)}},
            "sort": [{"created_at": "desc"}],
        }
        hits = self.client.search(index=self.runs, body=body)["hits"]["hits"]
        runs = [SyncRun.model_validate(hit["_source"]) for hit in hits]
        # A run's end is written with refresh=wait_for, and a GET sees it before a search does:
        # the runs the search still finds active are read again, or the list would say `running`
        # for a run that `GET .../runs/{id}` has just said ended.
        active = [run.run_id for run in runs if run.status.active]
        if not active:
            return runs
        found = self.client.mget(index=self.runs, body={"ids": active})["docs"]
        fresh = {doc["_id"]: SyncRun.model_validate(doc["_source"]) for doc in found if doc.get("found")}
        return [fresh.get(run.run_id, run) for run in runs]

    def active_run(self, tenant_id: str, kb_id: str, source_id: str) -> SyncRun | None:
        """The source's queued or running run, if any (there is at most one)."""
        self.client.indices.refresh(index=self.runs)
        query = {
            "bool": {
                "filter": [
                    *_scope(tenant_id, kb_id, source_id),
                    {"terms": {"status": [RunStatus.QUEUED.value, RunStatus.RUNNING.value]}},
                ]
            }
        }
        hits = self.client.search(index=self.runs, body={"size": 1, "query": query})["hits"]["hits"]
        return SyncRun.model_validate(hits[0]["_source"]) if hits else None

    def pending_runs(self, per_tenant: int = PENDING_PER_TENANT) -> list[list[SyncRun]]:
        """Queued or running runs, what the workers' runners claim: each tenant's oldest
        `per_tenant`, oldest first, a list for each tenant (the tenant of the oldest run first).

        One list for all tenants, oldest first, let a tenant that queued many runs at once (a
        schedule shared by hundreds of sources) hold every runner until its last one ran.
        """
        query = {"terms": {"status": [RunStatus.QUEUED.value, RunStatus.RUNNING.value]}}
        oldest = [{"created_at": "asc"}]
        body = {
            "size": PENDING_TENANTS,
            "query": query,
            "sort": oldest,
            "collapse": {
                "field": "tenant_id",
                "inner_hits": {"name": "runs", "size": per_tenant, "sort": oldest},
            },
        }
        hits = self.client.search(index=self.runs, body=body)["hits"]["hits"]
        return [
            [SyncRun.model_validate(run["_source"]) for run in hit["inner_hits"]["runs"]["hits"]["hits"]]
            for hit in hits
        ]

    def drop_runs(self, tenant_id: str, kb_id: str, source_id: str) -> None:
        self._delete_matching(self.runs, {"bool": {"filter": _scope(tenant_id, kb_id, source_id)}})

    # items

    def known(self, tenant_id: str, kb_id: str, source_id: str) -> dict[str, ItemState]:
        """Every item the source remembers, by key (a tombstone of a deleted one too)."""
        self.client.indices.refresh(index=self.items)
        query = {"bool": {"filter": _scope(tenant_id, kb_id, source_id)}}
        found: dict[str, ItemState] = {}
        after: list[Any] | None = None
        while True:
            body: dict[str, Any] = {"size": _PAGE, "query": query, "sort": [{"key": "asc"}]}
            if after is not None:
                body["search_after"] = after
            hits = self.client.search(index=self.items, body=body)["hits"]["hits"]
            for hit in hits:
                state = ItemState.model_validate(hit["_source"])
                found[state.key] = state
            if len(hits) < _PAGE:
                return found
            after = hits[-1]["sort"]

    def put_items(self, tenant_id: str, kb_id: str, source_id: str, states: list[ItemState]) -> None:
        scope = {"tenant_id": tenant_id, "kb_id": kb_id, "source_id": source_id}
        actions = (
            {
                "_op_type": "index",
                "_index": self.items,
                "_id": _item_id(tenant_id, kb_id, source_id, state.key),
                "_source": {**scope, **state.model_dump(mode="json")},
            }
            for state in states
        )
        _, errors = helpers.bulk(self.client, actions, raise_on_error=False, max_retries=3)
        if errors:
            raise RaglineError(f"{len(errors)} item records were not written", code=ErrorCode.UNAVAILABLE)

    def run_outcomes(self, tenant_id: str, kb_id: str, source_id: str, run_id: str) -> dict[str, int]:
        """How many items the run left in each outcome."""
        self.client.indices.refresh(index=self.items)
        query = {"bool": {"filter": [*_scope(tenant_id, kb_id, source_id), {"term": {"run_id": run_id}}]}}
        body = {"size": 0, "query": query, "aggs": {"o": {"terms": {"field": "outcome", "size": 10}}}}
        buckets = self.client.search(index=self.items, body=body)["aggregations"]["o"]["buckets"]
        counts = {outcome.value: 0 for outcome in ItemOutcome}
        counts.update({str(b["key"]): int(b["doc_count"]) for b in buckets})
        return counts

    def run_failures(self, tenant_id: str, kb_id: str, source_id: str, run_id: str) -> list[ItemFailure]:
        query = {
            "bool": {
                "filter": [
                    *_scope(tenant_id, kb_id, source_id),
                    {"term": {"run_id": run_id}},
                    {"term": {"outcome": ItemOutcome.FAILED.value}},
                ]
            }
        }
        body = {"size": MAX_FAILURES_KEPT, "query": query, "sort": [{"key": "asc"}]}
        hits = self.client.search(index=self.items, body=body)["hits"]["hits"]
        return [f for hit in hits if (f := ItemState.model_validate(hit["_source"]).error) is not None]

    def drop_tombstones(self, tenant_id: str, kb_id: str, source_id: str, run_id: str) -> None:
        """Forget items deleted by runs before `run_id`: their documents are gone already."""
        query = {
            "bool": {
                "filter": [
                    *_scope(tenant_id, kb_id, source_id),
                    {"term": {"outcome": ItemOutcome.DELETED.value}},
                ],
                "must_not": [{"term": {"run_id": run_id}}],
            }
        }
        self.client.delete_by_query(index=self.items, body={"query": query}, conflicts="proceed")

    def drop_items(self, tenant_id: str, kb_id: str, source_id: str) -> None:
        self._delete_matching(self.items, {"bool": {"filter": _scope(tenant_id, kb_id, source_id)}})

    def _delete_matching(self, index: str, query: dict[str, Any]) -> None:
        """Delete every record `query` matches, those changed while the deletion ran too.

        A delete-by-query skips a record written after its search saw it (a version conflict):
        a source changed (PATCHed, its run recorded) while its knowledge base was deleted
        outlived the KB, went on running, and filled a new KB of the same id. It is searched
        again until nothing is skipped; a write after that finds the record gone. The search only
        sees what a refresh made visible: records written a moment ago are made so first.
        """
        self.client.indices.refresh(index=index)
        for _ in range(UPDATE_ATTEMPTS):
            done = self.client.delete_by_query(
                index=index, body={"query": query}, refresh=True, conflicts="proceed"
            )
            if not done.get("version_conflicts"):
                return
            self.client.indices.refresh(index=index)
        raise RaglineError("the records are being changed concurrently; retry", code=ErrorCode.CONFLICT)

    # the optimistic read-change-write of sources and runs

    def _read(self, index: str, key: str, model: type[ModelT]) -> tuple[ModelT, int, int]:
        try:
            found = self.client.get(index=index, id=key)
        except NotFoundError:
            what = "source" if model is Source else "run"
            raise SourceNotFound(f"{what} '{key.rsplit('/', 1)[-1]}' not found") from None
        return model.model_validate(found["_source"]), int(found["_seq_no"]), int(found["_primary_term"])

    def _update(
        self, index: str, key: str, model: type[ModelT], change: Callable[[ModelT], ModelT]
    ) -> ModelT:
        for _ in range(UPDATE_ATTEMPTS):
            current, seq_no, term = self._read(index, key, model)
            updated = change(current.model_copy(deep=True))
            if updated == current:
                return current  # nothing to write: writers that agree do not race each other
            if hasattr(updated, "updated_at"):
                updated.updated_at = utcnow()
            try:
                self.client.index(
                    index=index,
                    id=key,
                    body=updated.model_dump(mode="json"),
                    if_seq_no=seq_no,
                    if_primary_term=term,
                    refresh="wait_for",
                )
            except ConflictError:
                continue
            return updated
        raise RaglineError("the record is being changed concurrently; retry", code=ErrorCode.CONFLICT)

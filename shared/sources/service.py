"""Sources as the fronts (REST, MCP, the CLI) see them: add, list, read, sync and remove.

Adding a source checks what can be checked without reaching it: the knowledge base exists, a
folder lies under a configured root, a URL is one the fetch policy allows. The workers check again
when they reach it. A sync or a removal is a run that the workers' runners carry out
(workers/sources/runner.py); this module only queues it and wakes them.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from pydantic import BaseModel

from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.fetch.policy import FetchPolicy, check_url
from shared.models import utcnow
from shared.registry import NotFound, Registry
from shared.sources.models import (
    FolderSpec,
    GitSpec,
    RunStatus,
    S3Spec,
    Schedule,
    Source,
    SourceChange,
    SourceSpec,
    SourceType,
    SyncRun,
    Trigger,
    WebSpec,
)
from shared.sources.store import SourceNotFound, SourceStore, source_key

WAKE_KEY = "ragline:sources:wake"  # runners block on it, so a queued run starts at once
MAX_SOURCES_PER_KB = 100
_START_LOCK_S = 10
SECRET_SETTINGS = ("secret_access_key",)


def folder_roots(settings: Settings, tenant_id: str) -> list[Path]:
    """The directories a tenant's folder sources may read: the configured roots, `{tenant}` in one
    read as the tenant's id (a root per tenant: /srv/ragline/{tenant})."""
    return [Path(str(root).replace("{tenant}", tenant_id)) for root in settings.sources.folder_roots]


class SourceView(BaseModel):
    """A source as the API answers it: its settings without secrets, and its runs' state."""

    kb_id: str
    source_id: str
    type: SourceType
    name: str
    settings: dict[str, Any]
    schedule: dict[str, Any] | None
    doc_id_prefix: str
    max_deleted_share: float
    deletions_held: bool
    deleting: bool
    last_run: SyncRun | None
    active_run: SyncRun | None
    next_run_at: str | None
    created_at: str
    updated_at: str


def view(source: Source, active: SyncRun | None) -> SourceView:
    shown = {k: ("********" if k in SECRET_SETTINGS and v else v) for k, v in source.settings.items()}
    return SourceView(
        kb_id=source.kb_id,
        source_id=source.source_id,
        type=source.type,
        name=source.name,
        settings=shown,
        schedule=source.schedule.model_dump() if source.schedule else None,
        doc_id_prefix=source.doc_id_prefix,
        max_deleted_share=source.max_deleted_share,
        deletions_held=source.deletions_held,
        deleting=source.deleting,
        last_run=source.last_run,
        active_run=active,
        next_run_at=source.next_run_at.isoformat() if source.next_run_at else None,
        created_at=source.created_at.isoformat(),
        updated_at=source.updated_at.isoformat(),
    )


def stored_settings(spec: SourceSpec) -> dict[str, Any]:
    """The settings as the workers need them: secrets in clear (SecretStr dumps as stars)."""
    settings = spec.settings.model_dump(mode="json")
    for name in SECRET_SETTINGS:
        secret = getattr(spec.settings, name, None)
        if secret is not None:
            settings[name] = secret.get_secret_value()
    return settings


def _next_run(source: Source, schedule: Schedule | None) -> datetime | None:
    """When a source runs by itself under `schedule`: its interval after the last run ended, or now."""
    if schedule is None:
        return None
    now = utcnow()
    ended = source.last_run.finished_at if source.last_run is not None else None
    if ended is None:
        return now
    return max(now, ended + timedelta(seconds=schedule.interval_s))


class Sources:
    def __init__(
        self, settings: Settings, store: SourceStore, registry: Registry, broker: redis.Redis
    ) -> None:
        self.settings = settings
        self.store = store
        self.registry = registry
        self.broker = broker
        self.policy = FetchPolicy.of(settings.fetch.allow)

    def add(self, tenant_id: str, kb_id: str, spec: SourceSpec) -> SourceView:
        self.registry.get_kb(tenant_id, kb_id)
        self._check(tenant_id, spec)
        if len(self.store.of_kb(tenant_id, kb_id)) >= MAX_SOURCES_PER_KB:
            raise RaglineError(
                f"a knowledge base holds at most {MAX_SOURCES_PER_KB} sources", code=ErrorCode.RATE_LIMITED
            )
        source_id = spec.source_id or f"{spec.type.value}-{uuid.uuid4().hex[:8]}"
        self._no_kept_documents(tenant_id, kb_id, source_id)
        source = Source(
            tenant_id=tenant_id,
            kb_id=kb_id,
            source_id=source_id,
            type=spec.type,
            name=spec.name,
            settings=stored_settings(spec),
            schedule=spec.schedule,
            doc_id_prefix=spec.doc_id_prefix,
            max_deleted_share=spec.max_deleted_share,
            next_run_at=utcnow() if spec.schedule is not None else None,
        )
        created = self.store.create(source)
        try:
            self.registry.get_kb(tenant_id, kb_id)  # deleted meanwhile: its deletion missed this one
        except NotFound:
            self.store.delete(tenant_id, kb_id, created.source_id)
            raise
        return view(created, None)

    def _no_kept_documents(self, tenant_id: str, kb_id: str, source_id: str) -> None:
        """CONFLICT while documents a forgotten source of this id kept still carry it: a source
        added under it would own them, and its removal delete them. Their release is asked again
        (its first pass skips a document written at that moment), and done within moments."""
        if not self.registry.has_source_documents(tenant_id, kb_id, source_id):
            return
        self.registry.detach_source(tenant_id, kb_id, source_id)
        raise RaglineError(
            f"documents kept from an earlier source '{source_id}' still carry its id while they "
            "become uploads; add the source again in a moment, or give it another id",
            code=ErrorCode.CONFLICT,
        )

    def of_kb(self, tenant_id: str, kb_id: str) -> list[SourceView]:
        self.registry.get_kb(tenant_id, kb_id)
        return [view(s, self._active(s)) for s in self.store.of_kb(tenant_id, kb_id)]

    def get(self, tenant_id: str, kb_id: str, source_id: str) -> SourceView:
        source = self.store.get(tenant_id, kb_id, source_id)
        return view(source, self._active(source))

    def update(self, tenant_id: str, kb_id: str, source_id: str, change: SourceChange) -> SourceView:
        """Change a source's name, schedule or `max_deleted_share`; the fields `change` gives only.

        A schedule given anew starts from the last run's end (now, if that is past or there was
        none); null stops scheduled runs. Deletions held by a refused run stay held: a share
        raised now applies to later runs, and `allow_deletions` lets them go.
        """
        given = change.model_fields_set

        def changed(current: Source) -> Source:
            if current.deleting:
                raise RaglineError(f"source '{source_id}' is being removed", code=ErrorCode.CONFLICT)
            update: dict[str, Any] = {}
            if "name" in given and change.name is not None:
                update["name"] = change.name
            if "max_deleted_share" in given and change.max_deleted_share is not None:
                update["max_deleted_share"] = change.max_deleted_share
            if "schedule" in given:
                update["schedule"] = change.schedule
                update["next_run_at"] = _next_run(current, change.schedule)
            return current.model_copy(update=update)

        updated = self.store.update(tenant_id, kb_id, source_id, changed)
        return view(updated, self._active(updated))

    def sync(
        self,
        tenant_id: str,
        kb_id: str,
        source_id: str,
        *,
        allow_deletions: bool = False,
        retry_failed: bool = False,
    ) -> SyncRun:
        """Queue a run of the source, or answer the one already queued or running (one at a time).
        `allow_deletions`: the run may delete past the source's `max_deleted_share`;
        `retry_failed`: it ingests again the documents the pipeline failed, bytes unchanged."""
        source = self.store.get(tenant_id, kb_id, source_id)
        if source.deleting:
            raise RaglineError(f"source '{source_id}' is being removed", code=ErrorCode.CONFLICT)
        return self.start(source, "manual", allow_deletions=allow_deletions, retry_failed=retry_failed)

    def start(
        self,
        source: Source,
        trigger: Trigger,
        run_id: str | None = None,
        *,
        allow_deletions: bool = False,
        retry_failed: bool = False,
    ) -> SyncRun:
        key = source_key(source.tenant_id, source.kb_id, source.source_id)
        lock = self.broker.lock(
            f"ragline:sources:start:{key}", timeout=_START_LOCK_S, blocking_timeout=_START_LOCK_S
        )
        if not lock.acquire():
            raise RaglineError(
                "the source is being started by another request; retry", code=ErrorCode.CONFLICT
            )
        try:
            active = self.store.active_run(source.tenant_id, source.kb_id, source.source_id)
            if active is not None:
                if trigger != "remove":
                    return self._joined(active, allow_deletions=allow_deletions, retry_failed=retry_failed)
                if active.trigger == "remove":
                    return active  # a removal asked for again joins the one under way
                self.cancel(active)
            run = SyncRun(
                run_id=run_id or uuid.uuid4().hex,
                tenant_id=source.tenant_id,
                kb_id=source.kb_id,
                source_id=source.source_id,
                trigger=trigger,
                allow_deletions=allow_deletions,
                retry_failed=retry_failed,
            )
            self.store.create_run(run)
            self._fence(run)
        finally:
            lock.release()
        self.broker.rpush(WAKE_KEY, run.run_id)
        return run

    def _fence(self, run: SyncRun) -> None:
        """Take `run` back if its source went (or began to go) while it was written.

        The source read before the write may be gone by now: its removal ended, its knowledge base
        was deleted. A run written after their last sweep of the source's runs outlived the source
        and showed in the runs of a new source of the same id. The removals mark or delete the
        source (and the KB's record) before that sweep, so a run that still finds them here, after
        its own write, is swept with the rest; one that does not is deleted here.
        """
        scope = (run.tenant_id, run.kb_id, run.source_id)
        try:
            self.registry.get_kb(run.tenant_id, run.kb_id)
            source = self.store.get(*scope)
        except RaglineError:
            self.store.delete_run(run.run_id)
            raise
        if source.deleting and run.trigger != "remove":
            self.store.delete_run(run.run_id)
            raise RaglineError(f"source '{run.source_id}' is being removed", code=ErrorCode.CONFLICT)

    def _joined(self, active: SyncRun, **asked: bool) -> SyncRun:
        """The run under way, which a sync joins; one that asks for an option (`allow_deletions`,
        `retry_failed`) gets it on a run still queued, and is refused on one already listing
        without it."""
        wanted = {name: True for name, on in asked.items() if on and not getattr(active, name)}
        if not wanted:
            return active

        def given(current: SyncRun) -> SyncRun:
            if current.status != RunStatus.QUEUED:
                return current
            return current.model_copy(update=wanted)

        joined = self.store.update_run(active.run_id, given)
        missing = [name for name in wanted if not getattr(joined, name)]
        if missing:
            raise RaglineError(
                f"run {active.run_id} is under way without {' and '.join(missing)}; sync again with "
                "it once that run has ended",
                code=ErrorCode.CONFLICT,
            )
        return joined

    def cancel(self, run: SyncRun) -> SyncRun:
        def cancelled(current: SyncRun) -> SyncRun:
            if not current.status.active:
                return current
            return current.model_copy(update={"status": RunStatus.CANCELLED, "finished_at": utcnow()})

        return self.store.update_run(run.run_id, cancelled)

    def run(self, tenant_id: str, kb_id: str, source_id: str, run_id: str) -> SyncRun:
        self.store.get(tenant_id, kb_id, source_id)
        return self.store.get_run(tenant_id, kb_id, source_id, run_id)

    def runs(self, tenant_id: str, kb_id: str, source_id: str, limit: int = 20) -> list[SyncRun]:
        self.store.get(tenant_id, kb_id, source_id)
        return self.store.list_runs(tenant_id, kb_id, source_id, limit)

    def remove(self, tenant_id: str, kb_id: str, source_id: str, *, keep_documents: bool) -> SyncRun | None:
        """Remove a source. Its documents go with it (a removal run deletes them, then the source),
        unless `keep_documents`, when they stay as uploads would and only the source is forgotten."""
        source = self.store.get(tenant_id, kb_id, source_id)
        scope = (tenant_id, kb_id, source_id)
        if source.deleting:
            removal = self.store.active_run(*scope)
            if removal is not None and removal.trigger == "remove":
                if keep_documents:
                    # Its documents are going: a 204 would say they stay while the run deletes them.
                    raise RaglineError(
                        f"source '{source_id}' is being removed with its documents (run "
                        f"{removal.run_id}); the documents it has not deleted yet cannot be kept",
                        code=ErrorCode.CONFLICT,
                    )
                return removal  # a DELETE sent again answers the removal under way, without a lock
        if keep_documents:
            active = self.store.active_run(*scope)
            if active is not None:
                self.cancel(active)
            # Before the source goes: a DELETE that fails here may be sent again.
            self.registry.detach_source(*scope)
            self.store.drop_items(*scope)
            self.store.delete(*scope)
            self.store.drop_runs(*scope)  # after the source: see `_fence`
            return None
        if not source.deleting:
            self.store.update(*scope, lambda s: s.model_copy(update={"deleting": True, "next_run_at": None}))
        return self.start(source, "remove")

    def _active(self, source: Source) -> SyncRun | None:
        return self.store.active_run(source.tenant_id, source.kb_id, source.source_id)

    def _check(self, tenant_id: str, spec: SourceSpec) -> None:
        """What can be refused before any worker reaches the source."""
        if isinstance(spec, FolderSpec):
            self._check_folder(tenant_id, spec.settings.path)
        elif isinstance(spec, WebSpec):
            self._check_url(spec.settings.url)
            if spec.settings.prefix is not None:
                self._check_url(spec.settings.prefix)
        elif isinstance(spec, S3Spec):
            endpoint = spec.settings.endpoint_url or self.settings.sources.s3_endpoint_url
            if endpoint is not None:
                self._check_url(endpoint)
        elif isinstance(spec, GitSpec):
            url = spec.settings.url
            if url.startswith(("http://", "https://")):
                self._check_url(url)
            elif url.startswith("git://"):
                self._check_url("http://" + url.removeprefix("git://"))
            elif "://" in url or url.startswith("-"):
                raise RaglineError(
                    "a git source is an http(s):// or git:// URL, or a path", code=ErrorCode.INVALID_ARGUMENT
                )
            else:
                self._check_folder(tenant_id, url)

    def _check_url(self, url: str) -> None:
        self.policy.check_name(check_url(url))

    def _check_folder(self, tenant_id: str, path: str) -> None:
        roots = [root.resolve() for root in folder_roots(self.settings, tenant_id)]
        if not roots:
            raise RaglineError(
                "folder sources are off: RAGLINE_SOURCES__FOLDER_ROOTS names no directory they may read",
                code=ErrorCode.FORBIDDEN,
            )
        given = Path(path)
        if not given.is_absolute() or ".." in given.parts:
            raise RaglineError(
                "a source's path must be absolute, without '..'", code=ErrorCode.INVALID_ARGUMENT
            )
        if not any(given.is_relative_to(root) for root in roots):
            # The caller's own roots: where an admin of this tenant may put a source's files.
            raise RaglineError(
                "the path is not inside RAGLINE_SOURCES__FOLDER_ROOTS: "
                + ", ".join(str(root) for root in roots),
                code=ErrorCode.FORBIDDEN,
            )


__all__ = ["SourceNotFound", "SourceView", "Sources"]

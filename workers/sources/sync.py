"""One sync run of a source: list it, submit what is new or changed, delete what disappeared.

The run is resumable. Each item's outcome is written with the run's id (in pages, as the listing
goes), so a run that another worker resumes after a crash skips what was already done, and the
counts a run reports are those records counted, never a tally that a crash could double.

Nothing is deleted until the listing has ended without error: a listing cut short (an unreachable
bucket, a site that went down) must not read as "everything is gone". Nor when it would delete
more than the source's `max_deleted_share` (`check_deletions`). An item that could not be read
keeps its document as it was.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from datetime import timedelta

from shared.errors import ErrorCode, OutageError, RaglineError, TransientError
from shared.ingest import Ingestor, SubmitResult
from shared.models import DocStatus, ErrorInfo, Outcome, check_doc_id, utcnow
from shared.registry import NotFound, Registry
from shared.sources.models import ItemFailure, ItemOutcome, ItemState, RunStatus, Source, SyncRun
from shared.sources.store import SourceNotFound, SourceStore
from workers.sources.connector import Connector, Found, Gone

log = logging.getLogger(__name__)

FLUSH_ITEMS, FLUSH_EVERY_S = 200, 5.0
CHECK_EVERY_S = 2.0  # how often the run asks whether it may go on (cancelled, lease lost)
# A run whose tenant's queue stays full this long makes way for another tenant's run waiting for
# a runner: one tenant that keeps its own queue full must not hold every runner from the others.
MAKE_WAY_AFTER_S = 30.0
_OUTCOMES = {
    Outcome.CREATED: ItemOutcome.CREATED,
    Outcome.UPDATED: ItemOutcome.UPDATED,
    Outcome.UNCHANGED: ItemOutcome.UNCHANGED,
}
_ABSENT = (DocStatus.DELETED, DocStatus.DELETING)


class Stopped(Exception):
    """The run may not go on: it was cancelled, or this worker lost its claim on the source."""


class MadeWay(Stopped):
    """The run stepped aside while its tenant's queue stayed full, for another tenant's run that
    waited; it stays active, and resumed later it goes on from what it wrote down."""


def _goes_on() -> None:
    pass


def _nobody_waits() -> bool:
    return False


def failure(key: str, error: RaglineError) -> ItemFailure:
    return ItemFailure(key=key, code=error.code.value, message=error.message[:500])


@dataclass
class _Pass:
    """What one pass of a run holds while it lists the source."""

    source: Source
    run_id: str
    connector: Connector
    known: Mapping[str, ItemState]
    present: Mapping[str, DocStatus]
    retry_failed: bool = False  # the run ingests again the documents the pipeline failed
    # The documents this run retried before its worker died: resumed, it does not retry them again.
    retried: AbstractSet[str] = frozenset()
    seen: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)  # what an incremental listing said is gone
    # The key each document id was taken for in this pass: two keys may name one document (a page
    # linked as "a/" and as "a/index.html", files "a b.txt" and "a-b.txt"), and the first keeps it.
    claimed: dict[str, str] = field(default_factory=dict)
    pending: list[ItemState] = field(default_factory=list)
    flushed_at: float = field(default_factory=time.monotonic)
    # Raises Stopped once the run may not go on (cancelled, lease lost): asked while it waits, too.
    go_on: Callable[[], None] = _goes_on
    # Whether another tenant's run waits for a runner (`MAKE_WAY_AFTER_S`).
    others_wait: Callable[[], bool] = _nobody_waits
    throttled_s: float = 0.0  # how long this pass waited for room in its tenant's queue, in all


class SyncEngine:
    def __init__(
        self,
        store: SourceStore,
        registry: Registry,
        ingestor: Ingestor,
        connector_for: Callable[[Source], Connector],
        retry_after_s: float,
        max_items: int,
    ) -> None:
        self.store = store
        self.registry = registry
        self.ingestor = ingestor
        self.connector_for = connector_for
        self.retry_after_s = retry_after_s
        self.max_items = max_items

    def run(
        self, run: SyncRun, may_go_on: Callable[[], bool], others_wait: Callable[[], bool] = _nobody_waits
    ) -> SyncRun:
        """Carry `run` to its end (or until `may_go_on` says no, raising `Stopped`, or it makes way
        for another tenant's run, as `others_wait` tells, raising `MadeWay`); an outage of
        OpenSearch or Redis propagates and leaves the run to be resumed."""
        with _stopped_if_missing(run):  # its record went with its source or its KB
            started = self.store.update_run(run.run_id, _started)
        try:
            source = self.store.get(run.tenant_id, run.kb_id, run.source_id)
        except SourceNotFound:
            # The source went (its KB deleted) while the run waited or after a claim rewrote it:
            # nothing is left to sync or remove. Ended here, or every runner would pick it first
            # and fail on it again, and no other source's run would ever start.
            with _stopped_if_missing(run):
                return self.store.update_run(run.run_id, _orphaned)
        with self._stopped_if_gone(source, run):
            try:
                if started.trigger == "remove":
                    return self._remove(source, started, may_go_on)
                with _connector_faults("setup"):
                    connector = self.connector_for(source)
            except (OutageError, Stopped, SourceNotFound):
                raise
            except RaglineError as error:
                return self._end(source, started, RunStatus.FAILED, error=error)
            try:
                return self._sync(source, started, connector, may_go_on, others_wait)
            except MadeWay:
                # No failed attempt: a run's attempts bound its retries after errors (the runner's
                # RUN_ATTEMPTS), and one that made way four times ended failed at its next error.
                with _stopped_if_missing(run):
                    self.store.update_run(run.run_id, _not_an_attempt)
                raise
            finally:
                connector.close()

    @contextlib.contextmanager
    def _stopped_if_gone(self, source: Source, run: SyncRun) -> Iterator[None]:
        """A run whose source went while it ran (its KB deleted, or the source forgotten with its
        documents kept), the run's record with it, stops: what it wrote down since goes too, and
        there is nothing to end. It logged a fault of the engine, and a removal went on deleting
        the documents a DELETE with keep_documents had just kept."""
        try:
            yield
        except (SourceNotFound, Stopped) as stopped:
            if not self._stands(source):
                self.store.drop_items(source.tenant_id, source.kb_id, source.source_id)
                raise Stopped(run.run_id) from None
            raise stopped

    def _stands(self, source: Source) -> bool:
        try:
            self.store.get(source.tenant_id, source.kb_id, source.source_id)
        except SourceNotFound:
            return False
        return True

    def fail(self, run: SyncRun, error: Exception) -> SyncRun:
        """End `run` FAILED (INTERNAL) after an exception nothing typed: a fault of the engine itself.
        Left running, it would be claimed first and fail again in every round, ahead of every
        other source's run."""
        fault = RaglineError(f"the run failed unexpectedly ({type(error).__name__})", code=ErrorCode.INTERNAL)
        try:
            source = self.store.get(run.tenant_id, run.kb_id, run.source_id)
        except SourceNotFound:
            return self.store.update_run(run.run_id, _orphaned)
        current = self.store.get_run(*_scope(run), run.run_id)
        if not current.status.active:
            return current  # cancelled (or ended) meanwhile: that stands
        return self._end(source, current, RunStatus.FAILED, error=fault)

    def _sync(
        self,
        source: Source,
        run: SyncRun,
        connector: Connector,
        may_go_on: Callable[[], bool],
        others_wait: Callable[[], bool],
    ) -> SyncRun:
        scope = (source.tenant_id, source.kb_id, source.source_id)
        state = _Pass(
            source=source,
            run_id=run.run_id,
            connector=connector,
            known=self.store.known(*scope),
            present=self.registry.source_documents(*scope),
            retry_failed=run.retry_failed,
            retried=self._retried_before(run),
            go_on=lambda: self._check(run, may_go_on),
            others_wait=others_wait,
        )
        checked = time.monotonic()
        try:
            for entry in _listed(connector.scan(state.known, run.run_id, _again(state))):
                if time.monotonic() - checked > CHECK_EVERY_S:
                    self._check(run, may_go_on)
                    checked = time.monotonic()
                if len(state.seen) >= self.max_items:
                    raise RaglineError(
                        f"the source lists more than {self.max_items} items (RAGLINE_SOURCES__MAX_ITEMS)",
                        code=ErrorCode.TOO_LARGE,
                    )
                if isinstance(entry, Gone):
                    state.gone.add(entry.key)
                elif (outcome := self._take(state, entry)) is not None:
                    self._keep(state, outcome)
            self._flush(state, run)
            self._check(run, may_go_on)
            # What an incremental listing says is gone, or a whole listing did not find.
            missing = [
                known
                for key, known in state.known.items()
                if key not in state.seen
                and (key in state.gone or not connector.incremental)
                and known.outcome != ItemOutcome.DELETED
            ]
            if not run.allow_deletions:
                # Documents count, not items: an item that only ever failed (its doc id an upload's,
                # or taken by another name of the same document) has nothing the run would delete.
                doomed = {known.doc_id for known in missing if _deletes_document(state, known)}
                live = [status for status in state.present.values() if status not in _ABSENT]
                check_deletions(source, len(doomed), len(live))
            for known in missing:
                self._keep(state, self._delete(state, known))
            self._flush(state, run)
        except (OutageError, Stopped):
            self._flush(state, run)
            raise
        except DeletionsHeld as held:
            self._flush(state, run)
            return self._end(source, run, RunStatus.FAILED, error=held, listed=len(state.seen), held=True)
        except RaglineError as error:  # the listing itself failed: delete nothing
            self._flush(state, run)
            return self._end(source, run, RunStatus.FAILED, error=error, listed=len(state.seen))
        try:
            untouched, written = self._untouched(state, run) if connector.incremental else (0, 0)
        except (OutageError, Stopped):
            self._flush(state, run)  # what it retried before it stopped, written down
            raise
        return self._end(
            source,
            run,
            RunStatus.SUCCEEDED,
            listed=len(state.seen) + untouched + written,
            untouched=untouched,
            cursor=connector.cursor(),
            held=False,
        )

    def _retried_before(self, run: SyncRun) -> AbstractSet[str]:
        """What an earlier attempt of this run retried, though it may not have written it down: the
        documents in the run's batch (a retry sets it; none at its first start). Read whatever its
        attempts say: a run that made way was resumed without counting one."""
        if not run.retry_failed:
            return frozenset()
        return set(self.registry.source_documents(run.tenant_id, run.kb_id, run.source_id, run.run_id))

    def _untouched(self, state: _Pass, run: SyncRun) -> tuple[int, int]:
        """The items an incremental listing did not name, as they were: how many are unchanged,
        and how many the run wrote down otherwise (their documents failed, and the run counts
        them, or retries them)."""
        untouched = written = 0
        for key, known in state.known.items():
            if key in state.seen or key in state.gone or known.outcome == ItemOutcome.DELETED:
                continue
            item = known.model_copy(
                update={"run_id": state.run_id, "outcome": ItemOutcome.UNCHANGED, "error": None}
            )
            kept = self._unchanged(state, known, item)
            if kept.outcome == ItemOutcome.UNCHANGED:
                untouched += 1
            else:
                self._keep(state, kept)
                written += 1
        self._flush(state, run)
        return untouched, written

    def _take(self, state: _Pass, entry: Found) -> ItemState | None:
        if entry.key in state.seen:
            return None  # listed twice (a page linked under two spellings): taken once
        state.seen.add(entry.key)
        known = state.known.get(entry.key)
        doc_id = state.source.doc_id_prefix + entry.doc_id
        owner = state.claimed.setdefault(doc_id, entry.key)
        if known is not None and known.run_id == state.run_id and known.outcome != ItemOutcome.FAILED:
            return None  # done before this run was resumed
        item = ItemState(
            key=entry.key,
            doc_id=doc_id,
            run_id=state.run_id,
            outcome=ItemOutcome.UNCHANGED,
            extra=entry.extra,
        )
        if owner != entry.key:
            taken = RaglineError(
                f"'{entry.key}' becomes document '{doc_id}', which '{owner}' of this source already "
                "is; only that one is taken",
                code=ErrorCode.CONFLICT,
            )
            return _failed(item, known, taken)
        if entry.error is not None:
            return _failed(item, known, entry.error)
        live = (
            known is not None
            and known.outcome != ItemOutcome.DELETED
            and state.present.get(doc_id) not in (None, *_ABSENT)
        )
        if (
            live
            and known is not None
            and (entry.unchanged or (entry.version is not None and entry.version == known.version))
        ):
            return self._unchanged(
                state, known, item.model_copy(update={"extra": entry.extra or known.extra})
            )
        try:
            check_doc_id(doc_id)
            if entry.content is not None:
                data = entry.content
            else:
                with _connector_faults("read"):
                    data = state.connector.read(entry)
            submitted = self._submit(state, entry, doc_id, data)
        except OutageError:
            raise
        except RaglineError as error:
            return _failed(item, known, error)
        submitted_item = item.model_copy(update={"version": entry.version, "outcome": _OUTCOMES[submitted]})
        if submitted == Outcome.UNCHANGED:
            # A new version of the same bytes (a file touched, copied over itself): as they were.
            return self._as_its_document(state, submitted_item)
        return submitted_item

    def _unchanged(self, state: _Pass, known: ItemState, item: ItemState) -> ItemState:
        """An item as it was when its document was made. Its bytes are not submitted again,
        whatever its document's failure: the pipeline retried what a retry could mend before it
        gave up, and the same bytes would only fail the same way, every run (a parse that outlasts
        its timeout, a PII policy that blocks)."""
        return self._as_its_document(state, item.model_copy(update={"version": known.version}))

    def _as_its_document(self, state: _Pass, item: ItemState) -> ItemState:
        """`item`, `unchanged`, or `failed` while the document it made stays failed; in a run that
        retries failed documents, such a one is ingested again and `updated`."""
        if item.doc_id in state.retried:
            return item.model_copy(update={"outcome": ItemOutcome.UPDATED})
        if state.present.get(item.doc_id) != DocStatus.FAILED:
            return item
        error = self._document_failure(state.source, item.doc_id)
        if error is None:
            return item
        if state.retry_failed:
            return self._retried(state, item)
        return item.model_copy(update={"outcome": ItemOutcome.FAILED, "error": failure(item.key, error)})

    def _retried(self, state: _Pass, item: ItemState) -> ItemState:
        """The failed document of `item` ingested again from its stored bytes, in the run's batch;
        while the tenant's queue is full (429), the run waits as a client would."""
        source = state.source
        try:
            self._admitted(
                state,
                lambda: self.ingestor.reingest(
                    source.tenant_id, source.kb_id, item.doc_id, batch_id=state.run_id
                ),
            )
        except OutageError:
            raise
        except RaglineError as error:
            return item.model_copy(update={"outcome": ItemOutcome.FAILED, "error": failure(item.key, error)})
        return item.model_copy(update={"outcome": ItemOutcome.UPDATED})

    def _admitted(self, state: _Pass, send: Callable[[], SubmitResult]) -> SubmitResult:
        """`send()`, waiting as a client would while the tenant's queue is full (429), and asking
        meanwhile whether the run may go on, or should make way for another tenant's."""
        while True:
            try:
                return send()
            except RaglineError as error:
                if error.code != ErrorCode.RATE_LIMITED:
                    raise
                delay = float(error.details.get("retry_after", self.retry_after_s))
            # The waits of the whole pass count: a queue that makes room for one document every
            # few seconds never keeps one document waiting long, yet holds the runner all along.
            if state.throttled_s >= MAKE_WAY_AFTER_S and state.others_wait():
                raise MadeWay(state.run_id)
            deadline = time.monotonic() + delay
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, CHECK_EVERY_S))
                state.go_on()
            state.throttled_s += delay

    def _document_failure(self, source: Source, doc_id: str) -> RaglineError | None:
        """Why the document failed, where it still has (None: a reingest has taken it on since)."""
        current = self.registry.get_doc(source.tenant_id, source.kb_id, doc_id)
        if current is None or current.doc.status != DocStatus.FAILED:
            return None
        found = current.doc.error or ErrorInfo(code=ErrorCode.INTERNAL.value, message="it failed")
        try:
            code = ErrorCode(found.code)
        except ValueError:
            code = ErrorCode.INTERNAL
        stage = f" in {found.stage}" if found.stage else ""
        return RaglineError(
            f"the document failed{stage}: {found.message} (its bytes are the same since: change them, "
            "reingest the document, or sync with retry_failed, to try again)",
            code=code,
        )

    def _submit(self, state: _Pass, entry: Found, doc_id: str, data: bytes) -> Outcome:
        """Submit the item's bytes; while the tenant's queue is full (429), wait as a client would.

        A resumed run submits again what it submitted before its worker died and had not yet
        written down: the document, unchanged now, says what this run's submit brought it.
        """
        source = state.source
        result = self._admitted(
            state,
            lambda: self.ingestor.submit(
                source.tenant_id,
                source.kb_id,
                data,
                filename=entry.filename,
                mime_type=entry.mime_type,
                doc_id=doc_id,
                source_uri=entry.uri,
                source_id=source.source_id,
                batch_id=state.run_id,
            ),
        )
        if result.outcome == Outcome.UNCHANGED:
            current = self.registry.get_doc(source.tenant_id, source.kb_id, doc_id)
            if current is not None and current.doc.batch_id == state.run_id and current.doc.outcome:
                return current.doc.outcome
        return result.outcome

    def _delete(self, state: _Pass, known: ItemState) -> ItemState:
        source = state.source
        deleted = known.model_copy(
            update={"run_id": state.run_id, "outcome": ItemOutcome.DELETED, "error": None}
        )
        if not _deletes_document(state, known):
            # Its document is another item's still at the source, was deleted by hand already, or
            # was never the source's (its id an upload's): forgotten, and not counted as deleted
            # by this run, which deleted nothing.
            return known.model_copy(update={"outcome": ItemOutcome.DELETED, "error": None})
        try:
            self.ingestor.delete(source.tenant_id, source.kb_id, known.doc_id)
        except NotFound:
            pass  # deleted by hand already
        except (TransientError, OutageError):
            raise
        except RaglineError as error:
            return known.model_copy(
                update={
                    "run_id": state.run_id,
                    "outcome": ItemOutcome.FAILED,
                    "error": failure(known.key, error),
                }
            )
        return deleted

    def _keep(self, state: _Pass, item: ItemState) -> None:
        state.pending.append(item)
        if len(state.pending) >= FLUSH_ITEMS or time.monotonic() - state.flushed_at > FLUSH_EVERY_S:
            self._flush(state, None)

    def _flush(self, state: _Pass, run: SyncRun | None) -> None:
        source = state.source
        if state.pending:
            self.store.put_items(source.tenant_id, source.kb_id, source.source_id, state.pending)
            state.pending = []
        state.flushed_at = time.monotonic()
        listed = len(state.seen)
        self.store.update_run(state.run_id, lambda r: r.model_copy(update={"listed": listed}))

    def _check(self, run: SyncRun, may_go_on: Callable[[], bool]) -> None:
        try:
            current = self.store.get_run(run.tenant_id, run.kb_id, run.source_id, run.run_id)
        except SourceNotFound:
            raise Stopped(run.run_id) from None  # its knowledge base was deleted
        if current.status == RunStatus.CANCELLED or not may_go_on():
            raise Stopped(run.run_id)

    def _remove(self, source: Source, run: SyncRun, may_go_on: Callable[[], bool]) -> SyncRun:
        """A source's removal: delete every document it brought, then what it remembers, then it."""
        scope = (source.tenant_id, source.kb_id, source.source_id)
        present = self.registry.source_documents(*scope)
        state = _Pass(source, run.run_id, _NoConnector(), self.store.known(*scope), present)
        # Each deletion asks first whether the run may go on: cancelled (the source forgotten with
        # its documents kept) it deletes no more.
        for known in state.known.values():
            self._check(run, may_go_on)
            if known.outcome != ItemOutcome.DELETED:
                self._keep(state, self._delete(state, known))
        self._flush(state, run)
        # A document the source brought without a record of it (a run that died before writing
        # its items down, a record that failed to be written) is the source's all the same.
        remembered = {k.doc_id for k in state.known.values() if k.outcome != ItemOutcome.DELETED}
        for doc_id, status in present.items():
            if doc_id in remembered or status in _ABSENT:
                continue
            self._check(run, may_go_on)
            with contextlib.suppress(NotFound):
                self.ingestor.delete(source.tenant_id, source.kb_id, doc_id)
        ended = self._end(source, run, RunStatus.SUCCEEDED, listed=0, keep_source=False)
        self.store.drop_items(*scope)
        # The source before its runs: a run written for it meanwhile (a DELETE sent again) either
        # finds it gone and takes itself back, or is written before this sweep (Sources._fence).
        self.store.delete(*scope)
        self.store.drop_runs(*scope)
        return ended

    def _end(
        self,
        source: Source,
        run: SyncRun,
        status: RunStatus,
        *,
        error: RaglineError | None = None,
        listed: int | None = None,
        untouched: int = 0,
        cursor: dict[str, object] | None = None,
        keep_source: bool = True,
        held: bool | None = None,
    ) -> SyncRun:
        """End the run; `held`: whether the source's deletions are held from now on (None: as
        they were)."""
        scope = (source.tenant_id, source.kb_id, source.source_id)
        counts = self.store.run_outcomes(*scope, run.run_id)
        counts[ItemOutcome.UNCHANGED.value] += untouched
        failures = self.store.run_failures(*scope, run.run_id)
        if status == RunStatus.SUCCEEDED and counts.get(ItemOutcome.FAILED.value):
            status = RunStatus.COMPLETED_WITH_ERRORS
        finished = utcnow()

        def end(current: SyncRun) -> SyncRun:
            began = current.started_at or finished
            return current.model_copy(
                update={
                    "status": status,
                    "counts": counts,
                    "listed": listed if listed is not None else current.listed,
                    "failures": failures,
                    "error": ErrorInfo(code=error.code.value, message=error.message[:500]) if error else None,
                    "finished_at": finished,
                    "duration_s": round((finished - began).total_seconds(), 3),
                    "claimed_by": None,
                }
            )

        # The source learns how the run ended before the run says it has: whoever sees the run
        # ended reads its source's last run as that run.
        ended = end(self.store.get_run(*scope, run.run_id))
        if keep_source:

            def record(current: Source) -> Source:
                update: dict[str, object] = {"last_run": ended}
                if cursor is not None and status.completed:
                    update["cursor"] = cursor
                if held is not None:
                    update["deletions_held"] = held
                if current.schedule is not None:
                    update["next_run_at"] = finished + _interval(current)
                return current.model_copy(update=update)

            self.store.update(*scope, record)
        if status.completed:
            self.store.drop_tombstones(*scope, run.run_id)
        ended = self.store.update_run(run.run_id, end)
        log.info(
            "sync %s of %s/%s ended %s: %s",
            run.run_id,
            source.kb_id,
            source.source_id,
            status.value,
            counts,
        )
        return ended


@contextlib.contextmanager
def _connector_faults(what: str) -> Iterator[None]:
    """An exception a connector did not type (a bug, or input nobody foresaw: a link no URL parser
    reads, a corrupt archive) is INTERNAL: it fails the listing or the item like any typed error.
    Left to the runner, the run would stay running and be retried for ever, ahead of every run
    queued after it."""
    try:
        yield
    except RaglineError:
        raise
    except Exception as error:
        log.exception("a source connector's %s failed", what)
        raise RaglineError(
            f"the source's {what} failed unexpectedly ({type(error).__name__})", code=ErrorCode.INTERNAL
        ) from error


def _deletes_document(state: _Pass, known: ItemState) -> bool:
    """Whether deleting a gone item deletes a document: one of the source's as the run began, that
    no other item listed in this run names."""
    owner = state.claimed.get(known.doc_id, known.key) == known.key
    return owner and state.present.get(known.doc_id) not in (None, *_ABSENT)


class DeletionsHeld(RaglineError):
    code = ErrorCode.CONFLICT


def check_deletions(source: Source, missing: int, live: int) -> None:
    """Refuse a run that would delete more than the source's `max_deleted_share` of its documents
    (and more than one): a listing that found little (a site mid-deploy, an unmounted folder, a
    robots.txt typo) must not read as "everything is gone". Nothing is deleted then.

    Once refused, the source's deletions stay held: what the refused run ingested counts among
    its documents, so the next run's share would pass. They are let go by a run that deletes at
    most one document (the source is whole again) or one allowed to delete.
    """
    if missing <= 1:
        return
    if source.deletions_held:
        raise DeletionsHeld(
            f"the run would delete {missing} of the source's {live} documents, and its deletions are "
            "held since a run would have deleted more than its max_deleted_share; nothing was "
            "deleted. If they are gone for good, sync again with allow_deletions"
        )
    if missing > source.max_deleted_share * live:
        raise DeletionsHeld(
            f"the run would delete {missing} of the source's {live} documents, more than its "
            f"max_deleted_share ({source.max_deleted_share:g}) allows; nothing was deleted. If they "
            "are gone for good, sync again with allow_deletions"
        )


def _again(state: _Pass) -> set[str]:
    """The items an incremental listing names though nothing changed them since its cursor: those
    that failed, and those whose document went (deleted by hand), which a whole listing would
    ingest again."""
    return {
        key
        for key, known in state.known.items()
        if known.outcome == ItemOutcome.FAILED
        or (known.outcome != ItemOutcome.DELETED and state.present.get(known.doc_id) in (None, *_ABSENT))
    }


def _listed(entries: Iterator[Found | Gone]) -> Iterator[Found | Gone]:
    """The connector's listing, its untyped exceptions typed (`_connector_faults`)."""
    while True:
        with _connector_faults("listing"):
            entry = next(entries, None)
        if entry is None:
            return
        yield entry


def _failed(item: ItemState, known: ItemState | None, error: RaglineError) -> ItemState:
    """A failed item keeps the version it last had, so the next run compares with that again."""
    previous = known.version if known is not None else None
    return item.model_copy(
        update={"version": previous, "outcome": ItemOutcome.FAILED, "error": failure(item.key, error)}
    )


def _interval(source: Source) -> timedelta:
    assert source.schedule is not None
    return timedelta(seconds=source.schedule.interval_s)


def _scope(run: SyncRun) -> tuple[str, str, str]:
    return run.tenant_id, run.kb_id, run.source_id


def faulted(run: SyncRun) -> SyncRun:
    """A run marked failed without its counts or its source's record: what is left when ending it
    the usual way failed too."""
    if not run.status.active:
        return run
    error = ErrorInfo(code=ErrorCode.INTERNAL.value, message="the run failed unexpectedly")
    return run.model_copy(
        update={"status": RunStatus.FAILED, "finished_at": utcnow(), "claimed_by": None, "error": error}
    )


@contextlib.contextmanager
def _stopped_if_missing(run: SyncRun) -> Iterator[None]:
    try:
        yield
    except SourceNotFound:
        raise Stopped(run.run_id) from None


def _orphaned(run: SyncRun) -> SyncRun:
    error = ErrorInfo(code=ErrorCode.NOT_FOUND.value, message="the source was removed before the run ended")
    return run.model_copy(
        update={"status": RunStatus.CANCELLED, "finished_at": utcnow(), "claimed_by": None, "error": error}
    )


def _started(run: SyncRun) -> SyncRun:
    return run.model_copy(
        update={
            "status": RunStatus.RUNNING,
            "attempts": run.attempts + 1,
            "started_at": run.started_at or utcnow(),
        }
    )


def _not_an_attempt(run: SyncRun) -> SyncRun:
    return run.model_copy(update={"attempts": max(run.attempts - 1, 0)})


class _NoConnector(Connector):
    """The removal pass lists nothing: it only deletes what the source remembers."""

    def scan(
        self, known: Mapping[str, ItemState], run_id: str, again: AbstractSet[str] = frozenset()
    ) -> Iterator[Found | Gone]:
        return iter(())

    def read(self, item: Found) -> bytes:
        raise NotImplementedError

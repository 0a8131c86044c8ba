"""`ragline ingest`: load files and folders through the REST API, with live progress and a summary.

Doc ids are the paths relative to the given root, so a re-run maps every file to the same
document: unchanged files come back `unchanged`, an interrupted load completes what is missing.
"""

from __future__ import annotations

import fnmatch
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from client.http import ApiError, Remote, api_path
from shared.models import repeated_ids, safe_doc_id

TERMINAL = {"ready", "failed", "deleted"}
PLAIN_EVERY_S = 5.0
SHORT_BATCH_GRACE_S = 10.0


@dataclass
class LoadReport:
    batch_id: str
    scanned: int = 0
    uploaded: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    # Documents of an earlier run this one found unchanged and waited for (never sent again).
    earlier: Counter[str] = field(default_factory=Counter)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # uploads refused, by this run or the API
    failed: list[dict[str, Any]] = field(default_factory=list)  # documents of the batch, and of earlier runs
    chunks: int = 0
    throttled: int = 0
    seconds: float = 0.0
    # Since when the batch has been done with fewer documents than this run sent it (None: not so).
    short_since: float | None = None

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [*self.rejected, *self.failed]

    def as_dict(self) -> dict[str, Any]:
        return {
            "batch_id": self.batch_id,
            "files": self.scanned,
            "uploaded": self.uploaded,
            "outcomes": dict(self.outcomes),
            "statuses": dict(self.statuses),
            "earlier_statuses": dict(self.earlier),
            "failures": self.failures,
            "chunks": self.chunks,
            "throttled": self.throttled,
            "seconds": round(self.seconds, 2),
        }


def walk(paths: list[Path], pattern: str | None, recursive: bool) -> Iterator[tuple[Path, str]]:
    """(file, doc id) pairs; the id is the path relative to the argument it came from."""
    for root in paths:
        if root.is_file():
            candidates: list[tuple[Path, str]] = [(root, root.name)]
        elif root.is_dir():
            found = root.rglob("*") if recursive else root.glob("*")
            candidates = [(p, p.relative_to(root).as_posix()) for p in sorted(found) if p.is_file()]
        else:
            raise FileNotFoundError(str(root))
        for file, relative in candidates:
            if pattern is None or fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(file.name, pattern):
                yield file, safe_doc_id(relative)


def _one_file_a_document(files: list[tuple[Path, str]], report: LoadReport) -> list[tuple[Path, str]]:
    """The files to upload: of two whose names give one document id ("a b.txt" and "a-b.txt"),
    the first; the second is rejected, where uploading it would replace the first."""
    repeated = repeated_ids([doc_id for _, doc_id in files])
    for earlier, later in repeated:
        (file, doc_id), (first, _) = files[later], files[earlier]
        report.outcomes["rejected"] += 1
        message = f"{file} gives the same document id as {first}; give it another name"
        report.rejected.append({"doc_id": doc_id, "error": {"code": "CONFLICT", "message": message}})
    dropped = {later for _, later in repeated}
    return [pair for n, pair in enumerate(files) if n not in dropped]


def _upload(
    remote: Remote, kb: str, file: Path, doc_id: str, batch_id: str, metadata: dict[str, str]
) -> dict[str, Any]:
    with file.open("rb") as handle:
        body = remote.post(
            api_path("kbs", kb, "documents"),
            files=[("files", (file.name, handle, "application/octet-stream"))],
            data={
                "doc_id": doc_id,
                "batch_id": batch_id,
                "priority": "bulk",
                "metadata": json.dumps(metadata),
            },
        )
    return dict(body["documents"][0])


@dataclass(frozen=True)
class _Pace:
    """How fast a load goes so far, and when it would end at that pace (None: not known)."""

    docs_per_s: float
    chunks_per_s: float
    eta_s: float | None

    @classmethod
    def of(cls, report: LoadReport, elapsed: float, chunks_before: int) -> _Pace:
        elapsed = max(elapsed, 1e-6)
        done = sum(report.statuses.get(s, 0) for s in TERMINAL) + report.outcomes.get("unchanged", 0)
        rate, remaining = done / elapsed, report.scanned - done
        eta = remaining / rate if rate > 0 and remaining > 0 else None
        return cls(rate, (report.chunks - chunks_before) / elapsed, eta)

    def as_dict(self) -> dict[str, float | None]:
        return {
            "docs_per_s": round(self.docs_per_s, 3),
            "chunks_per_s": round(self.chunks_per_s, 2),
            "eta_s": None if self.eta_s is None else round(self.eta_s),
        }


def _render(report: LoadReport, pace: _Pace) -> Table:
    table = Table(show_header=False, box=None)
    table.add_row("files scanned", str(report.scanned))
    table.add_row("uploaded", f"{report.uploaded} (throttled {report.throttled}x)")
    table.add_row("outcomes", ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items())) or "-")
    table.add_row("documents", ", ".join(f"{k} {v}" for k, v in sorted(report.statuses.items())) or "-")
    eta = "-" if pace.eta_s is None else f"{pace.eta_s:.0f} s"
    # Two significant digits: a load of large documents runs well under one a second.
    docs = f"{pace.docs_per_s:.2g}"
    table.add_row("throughput", f"{docs} docs/s, {pace.chunks_per_s:.1f} chunks/s, ETA {eta}")
    return table


def _poll(remote: Remote, report: LoadReport) -> bool:
    """Refresh the counts from the batch; True when every document of it is terminal."""
    try:
        batch = remote.get(api_path("batches", report.batch_id))
    except ApiError as error:
        if error.code == "NOT_FOUND":
            # Either nothing of this run joined it (each upload unchanged or refused), or the
            # registry has not shown the batch yet (it refreshes about once a second): only the
            # former means done.
            return report.uploaded == report.outcomes.get("unchanged", 0)
        raise
    report.statuses = Counter(batch["counts"])
    report.failed = batch["failures"]
    if not batch["done"]:
        report.short_since = None
        return False
    if batch["total"] >= report.uploaded - report.outcomes.get("unchanged", 0):
        return True
    # Done, yet short: the registry has not shown every upload yet (it refreshes about once a
    # second), or a document of this run was replaced meanwhile by another upload, outside it.
    # The first passes; the second never would, and the load must not wait for it forever.
    now = time.monotonic()
    report.short_since = report.short_since or now
    return now - report.short_since > SHORT_BATCH_GRACE_S


class _Progress:
    """What a load shows as it goes: a live table on a terminal, else a JSON line every few seconds.

    Both carry the counts as of now: the elapsed seconds, and the knowledge base's chunk count,
    read again every few seconds (the table's chunk rate counts only chunks added since the start).
    """

    def __init__(self, remote: Remote, kb: str, report: LoadReport, console: Console) -> None:
        self.remote, self.kb, self.report, self.console = remote, kb, report, console
        self.started = time.monotonic()
        self.chunks_before = report.chunks = _chunks(remote, kb, report)
        self.last_plain = self.last_count = 0.0
        self.live = (
            Live(self._table(), console=console, refresh_per_second=4) if console.is_terminal else None
        )
        if self.live is not None:
            self.live.start()

    def _pace(self) -> _Pace:
        return _Pace.of(self.report, time.monotonic() - self.started, self.chunks_before)

    def _table(self) -> Table:
        return _render(self.report, self._pace())

    def show(self, force: bool = False) -> None:
        report = self.report
        report.throttled = self.remote.throttled
        report.seconds = time.monotonic() - self.started
        if force or time.monotonic() - self.last_count >= PLAIN_EVERY_S:
            self.last_count = time.monotonic()
            report.chunks = _chunks(self.remote, self.kb, report)
        if self.live is not None:
            self.live.update(self._table())
        elif not self.console.quiet and (force or time.monotonic() - self.last_plain >= PLAIN_EVERY_S):
            self.last_plain = time.monotonic()
            print(
                json.dumps(
                    {
                        "progress": report.as_dict()
                        | {"failures": len(report.failures)}
                        | self._pace().as_dict()
                    }
                ),
                file=sys.stderr,
            )

    def stop(self) -> None:
        if self.live is not None:
            self.live.stop()


def load(
    remote: Remote,
    kb: str,
    files: list[tuple[Path, str]],
    *,
    metadata: dict[str, str],
    concurrency: int,
    wait: bool,
    console: Console,
) -> LoadReport:
    report = LoadReport(batch_id=uuid.uuid4().hex, scanned=len(files))
    files = _one_file_a_document(files, report)
    progress = _Progress(remote, kb, report, console)
    unfinished: list[str] = []
    try:
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            futures = {pool.submit(_upload, remote, kb, f, d, report.batch_id, metadata): d for f, d in files}
            last_poll = time.monotonic()
            for future in as_completed(futures):
                doc_id = futures[future]
                try:
                    accepted = future.result()
                except ApiError as error:
                    report.outcomes["rejected"] += 1
                    report.rejected.append(
                        {"doc_id": doc_id, "error": {"code": error.code, "message": error.message}}
                    )
                    continue
                report.uploaded += 1
                report.outcomes[accepted["outcome"]] += 1
                if accepted["outcome"] == "unchanged" and accepted["status"] != "ready":
                    unfinished.append(doc_id)  # from an earlier run: still working, or failed for good
                if time.monotonic() - last_poll > 1.0:
                    last_poll = time.monotonic()
                    _poll(remote, report)
                progress.show()
        while wait and not _poll(remote, report):
            progress.show()
            time.sleep(1.0)
        earlier = _finish_earlier(remote, kb, unfinished) if wait else []
        for doc in earlier:
            report.earlier[doc["status"]] += 1
        report.failed += [
            {"kb_id": kb, "doc_id": d["doc_id"], "error": d["error"]}
            for d in earlier
            if d["status"] == "failed"
        ]
        progress.show(force=True)  # the final counts: chunks and seconds as of now
    finally:
        progress.stop()
    return report


def _finish_earlier(remote: Remote, kb: str, doc_ids: list[str]) -> list[dict[str, Any]]:
    """Wait for documents an interrupted run had submitted (this run found them unchanged)."""
    done = []
    for doc_id in doc_ids:
        while (doc := remote.get(api_path("kbs", kb, "documents", doc_id)))["status"] not in TERMINAL:
            time.sleep(1.0)
        done.append(doc)
    return done


def _chunks(remote: Remote, kb: str, report: LoadReport) -> int:
    """The knowledge base's chunk count now; the last one known if the API does not answer at once."""
    try:
        return int(remote.get(api_path("kbs", kb), attempts=1)["chunk_count"])
    except ApiError:
        return report.chunks


def summary_table(report: LoadReport) -> Table:
    table = Table()
    table.add_column("what")
    table.add_column("value", justify="right")  # counts, and the batch id and the seconds
    table.add_row("batch", report.batch_id)  # a row, not the title: a title wraps to the counts' width
    table.add_row("files", str(report.scanned))
    for name in ("created", "updated", "unchanged", "rejected"):
        table.add_row(name, str(report.outcomes.get(name, 0)))
    for name in ("ready", "failed"):
        table.add_row(f"{name} (this run)", str(report.statuses.get(name, 0)))
    # Unchanged documents an earlier run sent that were not ready yet: this run waited for them
    # (its exit status counts their failures, which the folder still holds), sent nothing again.
    for name in ("ready", "failed"):
        if report.earlier.get(name):
            table.add_row(f"{name} (an earlier run's, unchanged)", str(report.earlier[name]))
    table.add_row("throttled (429)", str(report.throttled))
    table.add_row("seconds", f"{report.seconds:.1f}")
    return table

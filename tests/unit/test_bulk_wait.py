"""`ragline ingest --wait`: a batch the registry does not show yet is not a finished batch, one
that can never be full ends the wait all the same, and two files never make one document."""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from client import bulk
from client.bulk import LoadReport, _poll, load, summary_table, walk
from client.http import ApiError, Remote


class _NoBatchYet(Remote):
    """The server's answer while the registry has not refreshed: the batch is not found."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "unused-key-0123456789")

    def get(self, path: str, **_: Any) -> Any:
        raise ApiError(404, "NOT_FOUND", f"{path} not found")


def test_new_documents_whose_batch_is_not_visible_yet_are_still_waited_for() -> None:
    report = LoadReport(batch_id="b", scanned=20, uploaded=20, outcomes=Counter(created=20))
    assert not _poll(_NoBatchYet(), report)


def test_a_run_of_unchanged_files_has_no_batch_and_is_done() -> None:
    report = LoadReport(batch_id="b", scanned=20, uploaded=20, outcomes=Counter(unchanged=20))
    assert _poll(_NoBatchYet(), report)


def test_a_run_whose_every_upload_was_refused_has_no_batch_and_is_done() -> None:
    """Every file refused (an API that could not store them): the load waited for its batch
    forever, printing its progress every few seconds."""
    report = LoadReport(batch_id="b", scanned=3, uploaded=1, outcomes=Counter(unchanged=1, rejected=2))
    assert _poll(_NoBatchYet(), report)
    refused = LoadReport(batch_id="b", scanned=3, uploaded=0, outcomes=Counter(rejected=3))
    assert _poll(_NoBatchYet(), refused)


class _Server(Remote):
    """An API that accepts every upload into one batch, which the registry shows at once (less
    `hidden` documents of it: replaced meanwhile by an upload outside this run)."""

    def __init__(self, hidden: int = 0) -> None:
        super().__init__("http://127.0.0.1:9", "unused-key-0123456789")
        self.uploaded: list[str] = []
        self.hidden = hidden

    def post(self, path: str, **kwargs: Any) -> Any:
        self.uploaded.append(kwargs["data"]["doc_id"])
        return {"documents": [{"outcome": "created", "status": "queued"}]}

    def get(self, path: str, **_: Any) -> Any:
        if "/batches/" in path:
            total = len(set(self.uploaded)) - self.hidden
            return {"counts": {"ready": total}, "failures": [], "done": True, "total": total}
        return {"chunk_count": 0}


def _files(tmp_path: Path, names: list[str]) -> list[tuple[Path, str]]:
    for name in names:
        (tmp_path / name).write_text(name)
    return list(walk([tmp_path], None, recursive=False))


def test_two_files_of_one_document_id_upload_one_and_reject_the_other(tmp_path: Path) -> None:
    """Uploaded both, the second replaced the first, and the load waited for a second document
    its batch would never hold."""
    server = _Server()
    files = _files(tmp_path, ["a b.txt", "a-b.txt", "c.txt"])
    report = load(server, "kb", files, metadata={}, concurrency=2, wait=True, console=Console(quiet=True))
    assert sorted(server.uploaded) == ["a-b.txt", "c.txt"]
    assert report.outcomes == Counter(created=2, rejected=1)
    [rejected] = report.failures
    assert rejected["doc_id"] == "a-b.txt"
    assert rejected["error"]["code"] == "CONFLICT"


def test_a_batch_left_short_by_an_upload_outside_the_run_ends_the_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "SHORT_BATCH_GRACE_S", 0.5)
    monkeypatch.setattr(time, "sleep", lambda _: None)  # the polls, one after another
    server = _Server(hidden=1)
    report = load(
        server,
        "kb",
        _files(tmp_path, ["x.txt", "y.txt"]),
        metadata={},
        concurrency=1,
        wait=True,
        console=Console(quiet=True),
    )
    assert report.statuses == Counter(ready=1)


class _FailedBefore(_Server):
    """An API where `old.txt` failed for good in an earlier run: its upload comes back unchanged."""

    def post(self, path: str, **kwargs: Any) -> Any:
        if kwargs["data"]["doc_id"] != "old.txt":
            return super().post(path, **kwargs)
        return {"documents": [{"outcome": "unchanged", "status": "failed"}]}

    def get(self, path: str, **kwargs: Any) -> Any:
        if path.endswith("/old.txt"):
            error = {"code": "UNSUPPORTED_MEDIA_TYPE", "message": "unsupported file type"}
            return {"doc_id": "old.txt", "status": "failed", "error": error}
        return super().get(path, **kwargs)


def test_an_earlier_runs_failure_is_reported_as_such_and_still_fails_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that failed in an earlier run, uploaded again unchanged, was counted as `failed (this
    run)` though nothing was sent again."""
    console = Console(file=io.StringIO(), force_terminal=False)  # progress goes to stderr as JSON lines
    files = _files(tmp_path, ["new.txt", "old.txt"])
    report = load(_FailedBefore(), "kb", files, metadata={}, concurrency=1, wait=True, console=console)
    assert report.statuses == Counter(ready=1)
    assert report.earlier == Counter(failed=1)
    assert [f["doc_id"] for f in report.failures] == ["old.txt"]  # the run still ends non-zero
    out = io.StringIO()
    Console(file=out, width=80).print(summary_table(report))
    cells = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.getvalue().splitlines()]
    rows = dict(cell for cell in cells if len(cell) == 2)
    assert rows["failed (this run)"] == "0"
    assert rows["failed (an earlier run's, unchanged)"] == "1"
    last = json.loads(capsys.readouterr().err.splitlines()[-1])["progress"]
    assert last["earlier_statuses"] == {"failed": 1}
    assert last["docs_per_s"] > 0
    assert last["eta_s"] is None  # nothing left

"""What the CLI prints: each fact once, columns only where they hold something, no wrapped ids."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
import typer
from rich.console import Console

from client.bulk import LoadReport, summary_table
from services.cli import remote_commands, source_commands


def _rendered(table: Any) -> str:
    out = io.StringIO()
    Console(file=out, width=80).print(table)
    return out.getvalue()


def test_the_load_summary_shows_the_batch_id_whole_and_says_what_ready_counts() -> None:
    report = LoadReport(batch_id="ba_0123456789abcdef0123456789abcdef")
    report.outcomes["unchanged"] = 6
    text = _rendered(summary_table(report))
    assert "ba_0123456789abcdef0123456789abcdef" in text
    assert "ready (this run)" in text
    assert "count" not in text.splitlines()[1]  # its column also holds the batch id and the seconds


class _Runs:
    def __init__(self, states: list[dict[str, Any]]) -> None:
        self.states = states

    def get(self, _: str) -> dict[str, Any]:
        return self.states.pop(0)

    def close(self) -> None:
        pass


def test_a_followed_run_prints_its_last_state_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = {"code": "UNAVAILABLE", "message": "x"}
    ended = {"run_id": "r1", "status": "failed", "listed": 0, "error": error}
    runs = _Runs([{"run_id": "r1", "status": "running", "listed": 3}, ended])
    monkeypatch.setattr(source_commands, "_remote", lambda *_: runs)
    monkeypatch.setattr(time, "sleep", lambda _: None)
    run = source_commands._follow(None, None, "kb", "s1", {"run_id": "r1", "status": "queued"}, False)
    with pytest.raises(typer.Exit):
        source_commands._finish(run, as_json=False)
    captured = capsys.readouterr()
    assert (captured.out + captured.err).count("UNAVAILABLE") == 1
    assert "running: listed 3" in captured.err


def test_search_shows_a_page_column_only_for_paged_hits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hits = [{"score": 0.5, "kb_id": "kb", "doc_id": "notes.md", "text": "some text"}]
    monkeypatch.setattr(remote_commands, "_remote", lambda *_: None)
    monkeypatch.setattr(remote_commands, "_call", lambda *_, **__: {"results": hits})
    printed: list[list[str]] = []
    monkeypatch.setattr(remote_commands, "_print", lambda _v, _j, columns, _r: printed.append(columns))
    remote_commands.search("query")
    hits[0]["page_num"] = 3
    remote_commands.search("query")
    assert printed == [["score", "kb_id", "doc_id", "text"], ["score", "kb_id", "doc_id", "page_num", "text"]]


def test_a_table_prints_nothing_for_none_and_ids_as_written(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(remote_commands, "console", Console(width=120))
    row = {"source_id": "[red]notes", "next_run_at": None, "name": "x"}
    remote_commands._print([row], False, ["source_id", "name", "next_run_at"], [row])
    out = capsys.readouterr().out
    assert "[red]notes" in out
    assert "None" not in out


def test_a_run_whose_items_failed_does_not_read_as_a_success() -> None:
    counts = {"created": 2, "failed": 1}
    run = {"run_id": "r1", "status": "completed_with_errors", "listed": 3, "counts": counts}
    line = source_commands._run_line(run)
    assert line.startswith("completed with errors: listed 3; created 2, failed 1")
    assert "completed_with_errors" in source_commands.ENDED


def test_a_sync_waits_for_its_documents_and_fails_on_one_that_failed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file that failed to parse showed only in `batch status`: the sync said succeeded, exit 0."""
    run = {"run_id": "r1", "status": "succeeded", "listed": 3, "counts": {"created": 3}}
    failure = {"kb_id": "kb", "doc_id": "broken.pdf", "error": {"code": "PARSE_ERROR", "message": "bad xref"}}
    answers = [
        run,  # POST .../sync: the run, ended already
        {"batch_id": "r1", "total": 3, "counts": {"queued": 3}, "done": False, "failures": []},
        {
            "batch_id": "r1",
            "total": 3,
            "counts": {"failed": 1, "ready": 2},
            "done": True,
            "failures": [failure],
        },
    ]
    asked: list[str] = []

    def call(_remote: object, method: str, path: str, **_: object) -> object:
        asked.append(f"{method} {path}")
        return answers.pop(0)

    monkeypatch.setattr(source_commands, "_remote", lambda *_: None)
    monkeypatch.setattr(source_commands, "_call", call)
    monkeypatch.setattr(time, "sleep", lambda _: None)
    with pytest.raises(typer.Exit) as ended:
        source_commands.source_sync("kb", "s1")
    assert ended.value.exit_code == 1
    assert asked[1:] == ["GET /v1/batches/r1", "GET /v1/batches/r1"]
    out = capsys.readouterr().out
    assert "documents: failed 1, ready 2" in out
    assert "broken.pdf: PARSE_ERROR: bad xref" in out

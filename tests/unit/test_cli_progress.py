"""`ragline ingest` off a terminal: each progress line carries the counts as of then."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from client import bulk
from client.http import Remote

FILES = 6
BUSY_POLLS = 4  # the batch answers "not done" this many times first
CHUNKS_EACH_READ = 7


class _Clock:
    """`time` as the load sees it: each reading half a second on, sleeps at once."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        self.now += 0.5
        return self.now

    def sleep(self, _: float) -> None:
        pass


class _Api(Remote):
    """The API's answers to a load: uploads accepted, a batch that finishes, chunks that grow."""

    def __init__(self) -> None:
        super().__init__("http://127.0.0.1:9", "unused-key-0123456789")
        self.chunks = 0
        self.polls = 0

    def request(self, method: str, path: str, **_: Any) -> Any:
        if method == "POST" and path == "/v1/kbs/k/documents":
            return {"documents": [{"outcome": "created", "status": "queued"}]}
        if path.startswith("/v1/batches/"):
            self.polls += 1
            done = self.polls > BUSY_POLLS
            counts = {"ready": FILES} if done else {"processing": FILES}
            return {"counts": counts, "failures": [], "done": done, "total": FILES}
        if path == "/v1/kbs/k":
            self.chunks += CHUNKS_EACH_READ
            return {"chunk_count": self.chunks}
        raise AssertionError(f"unexpected {method} {path}")


def test_plain_progress_lines_carry_chunks_and_seconds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for i in range(FILES):
        (tmp_path / f"n{i}.txt").write_text(f"note {i}")
    monkeypatch.setattr(bulk, "PLAIN_EVERY_S", 0.0)  # a line at every step, not every 5 s
    monkeypatch.setattr("client.bulk.time", _Clock())
    console = Console(file=io.StringIO(), force_terminal=False)
    report = bulk.load(
        _Api(),
        "k",
        list(bulk.walk([tmp_path], None, False)),
        metadata={},
        concurrency=2,
        wait=True,
        console=console,
    )
    lines = [json.loads(line)["progress"] for line in capsys.readouterr().err.splitlines()]
    chunks, seconds = [p["chunks"] for p in lines], [p["seconds"] for p in lines]
    print(f"{len(lines)} progress lines; chunks {chunks}; seconds {seconds}")
    assert len(lines) > BUSY_POLLS
    assert seconds[0] > 0
    assert seconds == sorted(set(seconds)), seconds  # each line later than the one before
    assert all(p["chunks"] > 0 for p in lines), lines
    assert chunks == sorted(chunks)
    assert chunks[-1] == report.chunks
    assert report.as_dict()["seconds"] >= lines[-1]["seconds"]

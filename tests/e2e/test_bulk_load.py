"""A corpus load through `ragline ingest`: 1,000 mixed files, a killed and resumed run, backpressure,
and an agent's single document overtaking the load on the interactive queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.search.client import build_client
from tests.e2e.helpers import RAGLINE, Server, start_server, stop_server
from tests.integration.helpers import mismatched_chunk_sets

pytestmark = pytest.mark.e2e

GOOD, BAD = 980, 20
QUEUE_BOUND = 60  # small, so this load must meet backpressure


def _corpus(root: Path) -> dict[str, str]:
    """1,000 files on disk; returns doc id -> expected final status."""
    expected: dict[str, str] = {}
    for i in range(GOOD):
        kind = i % 5
        folder = root / f"part{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        if kind == 0:
            name, body = f"note{i}.txt", f"Note {i}\n\nShipment {i} of copper wire left dock {i % 7}.\n"
        elif kind == 1:
            name, body = f"page{i}.md", f"# Page {i}\n\nThe widget {i} pairs with gadget {i * 3}.\n"
        elif kind == 2:
            name, body = (
                f"doc{i}.html",
                f"<html><body><h1>Doc {i}</h1><p>Bridge {i} spans river {i % 11}.</p></body></html>",
            )
        elif kind == 3:
            name, body = f"rows{i}.csv", f"item,qty\nbolt-{i},{i}\nnut-{i},{i * 2}\n"
        else:
            name, body = f"cfg{i}.json", json.dumps({"service": f"svc-{i}", "replicas": i % 4 + 1})
        (folder / name).write_text(body)
        expected[f"part{i % 10}/{name}"] = "ready"
    bad = root / "bad"
    bad.mkdir()
    for i in range(BAD):
        kind = i % 3
        name = [f"empty{i}.txt", f"program{i}.txt", f"broken{i}.pdf"][kind]
        data = [b"", b"MZ\x90\x00" + bytes(range(256)) * 2, b"%PDF-1.4\n%broken\x00\xff" * 4][kind]
        (bad / name).write_bytes(data)
        expected[f"bad/{name}"] = "failed"
    return expected


@pytest.fixture(scope="module")
def throttled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"RAGLINE_API__MAX_QUEUED_TASKS": str(QUEUE_BOUND), "RAGLINE_API__RETRY_AFTER_S": "1"}
    handle, process = start_server(tmp_path_factory.mktemp("bulk-api"), env)
    yield handle
    stop_server(process)


def _ingest(server: Server, kb: str, root: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "RAGLINE_SERVER": server.url, "RAGLINE_API_KEY": server.keys["a_admin"]}
    return subprocess.Popen(
        [RAGLINE, "ingest", str(root), "--kb", kb, "--recursive", "--json", "--concurrency", "4", *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _progress(line: str) -> dict[str, Any]:
    try:
        return dict(json.loads(line)["progress"])
    except (ValueError, KeyError, TypeError):
        return {}


def test_thousand_files_killed_resumed_throttled_and_overtaken(
    throttled_server: Server, tmp_path: Path, settings: Settings
) -> None:
    server = throttled_server
    expected = _corpus(tmp_path / "corpus")
    assert len(expected) == 1000
    kb = f"bulk-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=server.url, headers={"X-Api-Key": server.keys["a_admin"]}, timeout=60) as api:
        assert (
            api.post(
                "/v1/kbs", json={"kb_id": kb, "name": "bulk", "settings": {"pii_policy": "off"}}
            ).status_code
            == 201
        )

        # 1. Start the load and kill the CLI once a few hundred files are uploaded.
        first = _ingest(server, kb, tmp_path / "corpus")
        assert first.stderr is not None
        uploaded = 0
        for line in first.stderr:
            uploaded = _progress(line).get("uploaded", uploaded)
            if uploaded >= 250:
                break
        first.send_signal(signal.SIGKILL)
        first.wait()
        print(f"CLI killed after {uploaded} uploads")
        assert 0 < uploaded < 1000

        # 2. Run it again; while it runs, an agent ingests one document through the interactive queue.
        started = time.monotonic()
        second = _ingest(server, kb, tmp_path / "corpus")
        time.sleep(3)
        agent = api.post(
            f"/v1/kbs/{kb}/documents",
            json={"content": "Agent note: the kiln fires at dawn.", "doc_id": "agent-note"},
        )
        assert agent.status_code == 202, agent.text
        while api.get(f"/v1/kbs/{kb}/documents/agent-note").json()["status"] != "ready":
            assert time.monotonic() - started < 600
            time.sleep(0.25)
        agent_ready = time.monotonic() - started
        out, _ = second.communicate(timeout=1800)
        load_done = time.monotonic() - started
        # The agent's document overtakes the load: the interactive queue is served first.
        assert agent_ready < load_done

        summary = json.loads(out)
        print(
            f"summary: outcomes {summary['outcomes']}, statuses {summary['statuses']}, "
            f"throttled {summary['throttled']}, {summary['seconds']} s"
        )
        assert second.returncode == 1  # some files failed, so the exit code says so
        assert summary["files"] == 1000
        assert sum(summary["outcomes"].values()) == 1000
        # Accepted before the kill: unchanged now, or `updated` for the bad files, which failed and
        # are tried again (a failed document is never "unchanged").
        resubmitted = summary["outcomes"].get("unchanged", 0) + summary["outcomes"].get("updated", 0)
        assert resubmitted >= uploaded
        assert summary["throttled"] > 0
        unexpected = [f for f in summary["failures"] if expected.get(f["doc_id"]) != "failed"]
        assert unexpected == []  # with each one's error, to say why
        failed_ids = {f["doc_id"] for f in summary["failures"]}
        assert failed_ids == {d for d, s in expected.items() if s == "failed"}
        assert all(
            f["error"]["code"] in ("EMPTY_DOCUMENT", "UNSUPPORTED_MEDIA_TYPE", "PARSE_ERROR")
            for f in summary["failures"]
        )

        # 3. Every document ended as expected, once, with exactly one set of chunks.
        docs: dict[str, dict[str, Any]] = {}
        cursor = None
        while True:
            page = api.get(
                f"/v1/kbs/{kb}/documents", params={"limit": 1000, **({"cursor": cursor} if cursor else {})}
            ).json()
            docs.update({d["doc_id"]: d for d in page["documents"]})
            cursor = page["next_cursor"]
            if not cursor:
                break
    docs.pop("agent-note")
    assert {d: v["status"] for d, v in docs.items()} == expected
    _assert_one_chunk_set_per_document(build_client(settings.opensearch), settings, docs)


def _assert_one_chunk_set_per_document(
    client: OpenSearch, settings: Settings, docs: dict[str, dict[str, Any]]
) -> None:
    kb = next(iter(docs.values()))["kb_id"]  # unique to this run
    ready = {d: v["chunk_count"] for d, v in docs.items() if v["status"] == "ready"}
    ignored = {"agent-note"}  # another user's document in the same KB
    wrong = mismatched_chunk_sets(client, settings, (None, kb), ready)
    duplicates = [d for d in wrong if d not in ignored]
    print(f"documents with duplicate or mixed chunks: {len(duplicates)}")
    assert duplicates == []

"""A source with a schedule runs by itself, once per due time and one run at a time, however many
workers see it due: two workers of the same settings, as two hosts would run them."""

from __future__ import annotations

import os
import secrets
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.own_stack import OwnStack
from tests.e2e.sources import ENDED, add, counts, documents

pytestmark = pytest.mark.e2e

INTERVAL_S = 60  # the shortest schedule a source may have


def _runs(client: httpx.Client, kb: str, source_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/v1/kbs/{kb}/sources/{source_id}/runs")
    assert answer.status_code == 200, answer.text
    return list(answer.json()["runs"])


def _ended_runs(
    client: httpx.Client, kb: str, source_id: str, n: int, timeout_s: float
) -> list[dict[str, Any]]:
    """The source's runs, oldest first, once `n` of them have ended."""
    deadline = time.monotonic() + timeout_s
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = _runs(client, kb, source_id)
        if sum(r["status"] in ENDED for r in runs) >= n:
            return sorted(runs, key=lambda r: r["created_at"])
        time.sleep(0.5)
    pytest.fail(f"{n} runs did not end within {timeout_s}s: {runs}")


def _at(value: str) -> datetime:
    return datetime.fromisoformat(value)


def test_a_scheduled_source_runs_by_itself_once_per_due_time(sources_stack: OwnStack, folder: Path) -> None:
    (folder / "tides.md").write_text("# Tides\n\nThe harbour master posts the spring tides weekly.")
    (folder / "gulls.md").write_text("# Gulls\n\nHerring gulls nest on the chimney pots.")
    kb = f"sched-{secrets.token_hex(4)}"
    with sources_stack.another_worker(), sources_stack.server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
        source = add(
            client,
            kb,
            {
                "type": "folder",
                "source_id": "harbour",
                "settings": {"path": str(folder)},
                "schedule": {"interval_s": INTERVAL_S},
            },
        )
        assert source["schedule"] == {"interval_s": INTERVAL_S}

        # Due at once: both workers' runners see it, one run is made, nobody asked for it.
        [first] = _ended_runs(client, kb, "harbour", 1, timeout_s=INTERVAL_S / 2)
        assert (first["trigger"], first["status"], counts(first)) == ("schedule", "succeeded", {"created": 2})
        assert set(documents(client, kb)) == {"tides.md", "gulls.md"}
        view = client.get(f"/v1/kbs/{kb}/sources/harbour").json()
        assert _at(view["next_run_at"]) == _at(first["finished_at"]) + timedelta(seconds=INTERVAL_S)

        (folder / "gulls.md").write_text("# Gulls\n\nHerring gulls now nest on the lighthouse gallery.")
        future = time.time() + 5
        os.utime(folder / "gulls.md", (future, future))
        # Not before its time: nothing more runs until the interval has passed.
        time.sleep(INTERVAL_S / 2)
        assert len(_runs(client, kb, "harbour")) == 1

        runs = _ended_runs(client, kb, "harbour", 2, timeout_s=INTERVAL_S + 30)
        assert len(runs) == 2, runs
        second = runs[1]
        assert (second["trigger"], second["status"]) == ("schedule", "succeeded"), second
        assert counts(second) == {"updated": 1, "unchanged": 1}, second
        assert _at(second["started_at"]) >= _at(first["finished_at"]) + timedelta(seconds=INTERVAL_S)
        hit = client.post("/v1/search", json={"query": "gulls lighthouse", "kb_ids": [kb], "top_k": 1}).json()
        assert "lighthouse" in hit["results"][0]["text"]

        # Removing the source ends its schedule, its documents with it.
        assert client.delete(f"/v1/kbs/{kb}/sources/harbour").status_code == 202
        assert client.delete(f"/v1/kbs/{kb}").status_code == 204

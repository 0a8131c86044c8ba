"""Helpers of the sources tests: start a run over REST and wait for it as a user would, and check
what a run left in the knowledge base."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import Server
from tests.integration.stack_control import kill_worker, stack

ENDED = ("succeeded", "completed_with_errors", "failed", "cancelled")


def new_kb(server: Server, prefix: str) -> Iterator[str]:
    """A fixture's body: a new knowledge base of tenant a, deleted afterwards."""
    kb_id = f"{prefix}-{secrets.token_hex(4)}"
    with server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id}).status_code == 201
        yield kb_id
        client.delete(f"/v1/kbs/{kb_id}")


def add(client: httpx.Client, kb: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(f"/v1/kbs/{kb}/sources", json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


def wait_run(
    client: httpx.Client, kb: str, source_id: str, run_id: str, timeout_s: float = 600
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        run = client.get(f"/v1/kbs/{kb}/sources/{source_id}/runs/{run_id}").json()
        if run.get("status") in ENDED:
            return run
        time.sleep(0.3)
    pytest.fail(f"run {run_id} did not end within {timeout_s}s: {run}")


def sync(client: httpx.Client, kb: str, source_id: str, **options: bool) -> dict[str, Any]:
    """Start a run (with `options`: allow_deletions, retry_failed) and wait for it; the run's own
    record, as the API answers it."""
    params = {name: "true" for name, on in options.items() if on}
    started = client.post(f"/v1/kbs/{kb}/sources/{source_id}/sync", params=params)
    assert started.status_code == 202, started.text
    return wait_run(client, kb, source_id, started.json()["run_id"])


def counts(run: dict[str, Any]) -> dict[str, int]:
    """The run's non-zero counts per outcome."""
    return {k: v for k, v in run["counts"].items() if v}


def documents(client: httpx.Client, kb: str) -> dict[str, dict[str, Any]]:
    """Every live document of the KB by doc_id, once all are settled (ready or failed)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        docs: list[dict[str, Any]] = []
        cursor = None
        while True:
            page = client.get(
                f"/v1/kbs/{kb}/documents", params={"limit": 1000, **({"cursor": cursor} if cursor else {})}
            ).json()
            docs += page["documents"]
            cursor = page.get("next_cursor")
            if not cursor:
                break
        live = {d["doc_id"]: d for d in docs if d["status"] not in ("deleted", "deleting")}
        if all(d["status"] in ("ready", "failed") for d in live.values()):
            return live
        time.sleep(0.5)
    pytest.fail("the documents did not settle within 10 minutes")


def kill_worker_mid_run(
    client: httpx.Client, kb: str, source_id: str, settings: Any, at_least_listed: int
) -> dict[str, Any]:
    """Start a run, SIGKILL the worker once the run has written down `at_least_listed` items,
    start the worker again, and wait for the run to end."""
    started = client.post(f"/v1/kbs/{kb}/sources/{source_id}/sync").json()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        run = client.get(f"/v1/kbs/{kb}/sources/{source_id}/runs/{started['run_id']}").json()
        if run["status"] in ENDED:
            pytest.fail(f"the run ended before the worker could be killed: {run}")
        if run["status"] == "running" and run["listed"] >= at_least_listed:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the run never got going")
    kill_worker(settings)
    stack("up", "worker")
    return wait_run(client, kb, source_id, started["run_id"])

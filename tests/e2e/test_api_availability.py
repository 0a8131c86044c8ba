"""Unauthenticated bursts on every public endpoint never starve the authenticated API.

A burst of concurrent readiness probes once deadlocked the whole process on the broker's
connection pool; this sends bursts to every endpoint that answers without a key while a tenant
searches and uploads, and checks that every one of the tenant's requests is answered.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import Server, start_server, stop_server, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

PER_ENDPOINT = 300  # requests of each burst
CONCURRENCY = 64  # requests of all bursts in flight at once
SEARCHES = 40
UPLOADS = 10
# A bound on each request, far above an answer under load: a request past it is a hang.
CLIENT_TIMEOUT_S = 60.0

MCP_INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-03-26",
        "capabilities": {},
        "clientInfo": {"name": "burst", "version": "1"},
    },
}
# What each public endpoint may answer: /readyz may say 503 while the workers are busy.
BURSTS: dict[str, tuple[str, set[int]]] = {
    "/healthz": ("GET", {200}),
    "/readyz": ("GET", {200, 503}),
    "/metrics": ("GET", {200}),
    "/openapi.json": ("GET", {200}),
    "/mcp": ("POST", {401}),
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def burst_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(tmp_path_factory.mktemp("burst-api"), {})
    yield handle
    try:
        stop_server(process)
    except subprocess.TimeoutExpired:  # a hung API does not stop on SIGTERM
        process.kill()
        process.wait()


not_ready: Counter[str] = Counter()


async def _burst(client: httpx.AsyncClient, gate: asyncio.Semaphore, path: str) -> Counter[str]:
    method, _ = BURSTS[path]
    seen: Counter[str] = Counter()

    async def one() -> None:
        async with gate:
            try:
                headers = {"Accept": "application/json, text/event-stream"}
                body = MCP_INITIALIZE if method == "POST" else None
                response = await client.request(method, path, json=body, headers=headers)
                seen[str(response.status_code)] += 1
                if path == "/readyz" and response.status_code == 503:  # why, for the printed counts
                    for name, check in response.json()["checks"].items():
                        if not check["ok"]:
                            not_ready[f"{name} {check.get('error', check)}"] += 1
            except httpx.TransportError as error:
                seen[type(error).__name__] += 1

    await asyncio.gather(*(one() for _ in range(PER_ENDPOINT)))
    return seen


async def _tenant_work(server: Server, kb: str) -> tuple[Counter[str], list[str]]:
    """Searches and uploads one after another, as a tenant's client would, during the bursts."""
    seen: Counter[str] = Counter()
    doc_ids: list[str] = []
    headers = {"X-Api-Key": server.keys["a_admin"]}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=CLIENT_TIMEOUT_S) as client:
        for i in range(max(SEARCHES, UPLOADS)):
            calls: list[tuple[str, str, dict[str, Any]]] = []
            if i < SEARCHES:
                calls.append(
                    (
                        "search",
                        "/v1/search",
                        {"query": f"lighthouse keeper {i}", "kb_ids": [kb]},
                    )
                )
            if i < UPLOADS:
                doc_id = f"burst-{i}.txt"
                doc_ids.append(doc_id)
                content = f"Lighthouse log {i}\n\nThe keeper lit the lamp at dusk on day {i}.\n"
                calls.append(("upload", f"/v1/kbs/{kb}/documents", {"content": content, "doc_id": doc_id}))
            for kind, path, body in calls:
                try:
                    response = await client.post(path, json=body)
                except httpx.TransportError as error:
                    seen[f"{kind} {type(error).__name__}"] += 1
                    return seen, doc_ids  # the API hangs: waiting out the rest would only take longer
                seen[f"{kind} {response.status_code}"] += 1
    return seen, doc_ids


async def test_public_endpoint_bursts_leave_the_tenant_answered(burst_server: Server) -> None:
    server = burst_server
    kb = f"burst-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as admin:
        created = admin.post("/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}})
        assert created.status_code == 201, created.text

    gate = asyncio.Semaphore(CONCURRENCY)
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=server.url, timeout=CLIENT_TIMEOUT_S, limits=limits) as anonymous:
        bursts = [asyncio.ensure_future(_burst(anonymous, gate, path)) for path in BURSTS]
        tenant, doc_ids = await _tenant_work(server, kb)
        if tenant != Counter({"search 200": SEARCHES, "upload 202": UPLOADS}):
            for burst in bursts:
                burst.cancel()
            pytest.fail(f"the tenant was not answered during the bursts: {dict(tenant)}")
        by_endpoint = dict(zip(BURSTS, await asyncio.gather(*bursts), strict=True))
    print(
        f"bursts ({PER_ENDPOINT} each, {CONCURRENCY} in flight): {by_endpoint}; "
        f"not ready: {dict(not_ready)}; tenant: {dict(tenant)}"
    )

    for path, seen in by_endpoint.items():
        assert set(seen) <= {str(status) for status in BURSTS[path][1]}, (path, seen)
        assert sum(seen.values()) == PER_ENDPOINT

    # Afterwards the API answers as before: probes, the uploads processed, a search.
    with server.client("a_admin") as admin:
        assert admin.get("/healthz").status_code == 200
        docs = wait_ready(admin, kb, doc_ids, timeout_s=600)  # the worker is shared: allow for a queue
        assert {d["status"] for d in docs.values()} == {"ready"}
        assert admin.get("/readyz").json()["ready"] is True
        found = admin.post("/v1/search", json={"query": "keeper lit the lamp", "kb_ids": [kb]})
        assert found.status_code == 200
        assert found.json()["results"]

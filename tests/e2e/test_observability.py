"""Metrics, logs and traces after a real load: a worker and an API of their own, on the stack's services.

They get a Redis database, an index prefix and a state dir of their own, so the figures they
report are this test's alone (exact counts, queues that drain) whatever else ran on the stack.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from shared.config import Settings
from shared.models import PIPELINE, Stage
from shared.search.client import build_client
from tests.e2e.helpers import RAGLINE, Server, bound_to_test, free_port, start_server, stop_server, wait_ready

pytestmark = pytest.mark.e2e

DOCS = 20
REDIS_DB = 11  # the stack uses 0; FLUSHDB of this one touches nothing else
BAD = ("broken.pdf", b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\ngarbage\x00\xff" * 3)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

# Uploads bring their bytes, so their versions start at parse: fetch is for ingest by URL.
UPLOADED = PIPELINE[PIPELINE.index(Stage.PARSE) :]


@dataclass(frozen=True)
class Observed:
    server: Server
    worker_metrics: str
    worker_log: Path
    api_log: Path
    traces: Path


def _isolated_env(settings: Settings, state: Path, prefix: str) -> dict[str, str]:
    url = urlsplit(settings.redis.url)
    return {
        "RAGLINE_STATE_DIR": str(state),
        "RAGLINE_REDIS__URL": urlunsplit(url._replace(path=f"/{REDIS_DB}")),
        "RAGLINE_OPENSEARCH__INDEX_PREFIX": prefix,
        "RAGLINE_LOG_FORMAT": "json",
        "RAGLINE_TRACING__ENABLED": "true",
        "RAGLINE_TRACING__EXPORTER": "file",
    }


def _start_worker(tmp: Path, env: dict[str, str]) -> tuple[str, subprocess.Popen[bytes], Path]:
    port = free_port()
    log = tmp / "worker.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            bound_to_test([RAGLINE, "worker", "--name", f"obs-{uuid.uuid4().hex[:6]}", "--concurrency", "1"]),
            env={**os.environ, **env, "RAGLINE_METRICS__WORKER_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its pool processes share its group, stopped together below
        )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the endpoint opens once the worker is ready
        if process.poll() is not None:
            pytest.fail(f"the worker exited during startup:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return url, process, log
        except httpx.TransportError:
            time.sleep(0.5)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"the worker's metrics endpoint did not open:\n{log.read_text()[-3000:]}")


def _stop_worker(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory, settings: Settings) -> Iterator[Observed]:
    tmp = tmp_path_factory.mktemp("observability")
    prefix = f"obs{uuid.uuid4().hex[:8]}"
    env = _isolated_env(settings, tmp / "state", prefix)
    worker_url, worker, worker_log = _start_worker(tmp, env)
    try:
        server, api = start_server(tmp, env)
    except BaseException:
        _stop_worker(worker)
        raise
    try:
        yield Observed(server, worker_url, worker_log, tmp / "api.log", tmp / "state" / "traces.jsonl")
    finally:
        stop_server(api)
        _stop_worker(worker)
        build_client(settings.opensearch).indices.delete(index=f"{prefix}*", expand_wildcards="all")
        isolated = redis.Redis.from_url(env["RAGLINE_REDIS__URL"])
        isolated.flushdb()
        isolated.close()


def _scrape(url: str) -> Samples:
    text = httpx.get(url, timeout=30).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"missing series {name}{labels}"
    return samples[key]


def _poll(url: str, done: Any, timeout_s: float = 60) -> Samples:
    """Scrape until `done(samples)`: queues drain and registry counts refresh a moment after the load."""
    deadline = time.monotonic() + timeout_s
    samples = _scrape(url)
    while not done(samples) and time.monotonic() < deadline:
        time.sleep(0.5)
        samples = _scrape(url)
    return samples


@pytest.fixture(scope="module")
def load(observed: Observed) -> dict[str, Any]:
    request_id = f"obs-test-{uuid.uuid4().hex[:8]}"
    response: httpx.Response | None = None
    with observed.server.client("a_admin") as client:
        kb = f"kb-{uuid.uuid4().hex[:8]}"
        created = client.post("/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}})
        assert created.status_code == 201, created.text
        names = [f"note-{i:02d}.txt" for i in range(DOCS)]
        uploads = {
            name: f"Log {i}: the tug {i * 7} towed a barge past buoy {i % 5}.\n".encode()
            for i, name in enumerate(names)
        }
        uploads[BAD[0]] = BAD[1]
        # One request per document: one trace per document, whose stages may still share batches.
        for i, (name, data) in enumerate(uploads.items()):
            sent = client.post(
                f"/v1/kbs/{kb}/documents",
                files=[("files", (name, data, "application/octet-stream"))],
                headers={"X-Request-ID": f"{request_id}-{i}"},
            )
            assert sent.status_code == 202, sent.text
            response = response or sent
        docs = wait_ready(client, kb, list(uploads))
    return {"kb": kb, "names": names, "docs": docs, "response": response, "request_id": f"{request_id}-0"}


def test_the_load_itself(load: dict[str, Any]) -> None:
    docs = load["docs"]
    assert {docs[n]["status"] for n in load["names"]} == {"ready"}
    assert docs[BAD[0]]["status"] == "failed"
    assert docs[BAD[0]]["error"]["code"] == "PARSE_ERROR"


def test_worker_metrics_after_a_load(observed: Observed, load: dict[str, Any]) -> None:
    def drained(s: Samples) -> bool:
        queues = [v for (name, _), v in s.items() if name == "ragline_queue_depth"]
        return bool(queues) and sum(queues) == 0

    samples = _poll(observed.worker_metrics, drained)
    chunks = sum(int(load["docs"][n]["chunk_count"]) for n in load["names"])
    stage = "ragline_worker_stage_duration_seconds"
    for step in UPLOADED:
        count = _value(samples, f"{stage}_count", stage=step.value, outcome="ok")
        total = _value(samples, f"{stage}_sum", stage=step.value, outcome="ok")
        print(f"{step.value}: {count:.0f} documents")
        assert count >= DOCS
        assert total > 0
    assert _value(samples, f"{stage}_count", stage="parse", outcome="failed") == 1
    assert _value(samples, "ragline_worker_documents_total", status="ready") == DOCS
    assert _value(samples, "ragline_worker_documents_total", status="failed") == 1
    assert _value(samples, "ragline_worker_failures_total", stage="parse", code="PARSE_ERROR") == 1
    batches = _value(samples, "ragline_worker_embed_batch_chunks_count")
    print(f"embedding: {chunks} chunks in {batches:.0f} batches")
    assert _value(samples, "ragline_worker_embed_batch_chunks_sum") == chunks
    assert _value(samples, "ragline_worker_embed_batch_documents_sum") == DOCS
    assert 1 <= batches <= DOCS
    assert _value(samples, "ragline_worker_embed_model_cpu_seconds_total") > 0  # the model's share of the CPU
    bulks = _value(samples, "ragline_worker_opensearch_bulk_seconds_count", outcome="ok")
    print(f"bulk: {bulks:.0f} requests")
    # The documents an embedding batch hands on are stored together: shared bulk requests.
    assert 1 <= bulks <= DOCS
    for queue in ("interactive", "bulk"):
        assert _value(samples, "ragline_queue_depth", queue=queue) == 0
    assert _value(samples, "ragline_fair_lanes") == 0
    assert _value(samples, "ragline_fair_waiting") == 0


def test_api_metrics_after_a_load(observed: Observed, load: dict[str, Any]) -> None:
    url = f"{observed.server.url}/metrics"

    def counted(s: Samples) -> bool:  # the registry's search side refreshes each second
        return s.get(("ragline_documents", (("status", "ready"),))) == DOCS

    samples = _poll(url, counted)
    assert _value(samples, "ragline_documents", status="ready") == DOCS
    assert _value(samples, "ragline_documents", status="failed") == 1
    upload = {"method": "POST", "route": "/v1/kbs/{kb_id}/documents", "status": "202"}
    assert _value(samples, "ragline_http_request_duration_seconds_count", **upload) == DOCS + 1
    polls = _value(
        samples,
        "ragline_http_request_duration_seconds_count",
        method="GET",
        route="/v1/kbs/{kb_id}/documents/{doc_id:path}",
        status="200",
    )
    assert polls >= DOCS + 1
    routes = {dict(labels).get("route") for name, labels in samples if name.startswith("ragline_http")}
    assert not any(load["kb"] in str(route) for route in routes)  # templates, never ids
    for queue in ("interactive", "bulk"):
        assert (("ragline_queue_depth", (("queue", queue),))) in samples
    for step in UPLOADED:
        assert _value(samples, "ragline_stage_duration_seconds_count", stage=step.value) >= DOCS


def _json_lines(path: Path) -> list[dict[str, Any]]:
    lines = []
    for raw in path.read_text().splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    return lines


def test_log_lines_carry_tenant_kb_document_stage_and_request_id(
    observed: Observed, load: dict[str, Any]
) -> None:
    kb, request_id = load["kb"], load["request_id"]
    assert load["response"].headers["X-Request-ID"] == request_id
    with observed.server.client("a_admin") as client:
        made = client.get("/healthz").headers["X-Request-ID"]
        refused = client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert len(made) == 32
    assert refused.headers["X-Request-ID"] != "bad id with spaces"

    api = _json_lines(observed.api_log)
    upload = [line for line in api if line.get("request_id") == request_id]
    assert upload, "no API log line carries the upload's request id"
    assert all(line["tenant"].startswith("ta-") and line["kb"] == kb for line in upload)
    assert all({"ts", "level", "service", "logger", "msg"} <= set(line) for line in api)
    api_text = observed.api_log.read_text()
    assert not any(secret in api_text for secret in observed.server.keys.values())

    worker = _json_lines(observed.worker_log)
    ready = {line["doc_id"] for line in worker if line.get("kb") == kb and "ready" in line["msg"]}
    assert ready == set(load["names"])
    failed = [line for line in worker if line.get("doc_id") == BAD[0] and line["level"] == "warning"]
    assert failed
    assert failed[0]["stage"] == "parse"
    assert failed[0]["tenant"].startswith("ta-")


def test_one_trace_per_upload_through_every_stage(observed: Observed, load: dict[str, Any]) -> None:
    stages = {f"stage {step.value}" for step in UPLOADED}

    def traced() -> tuple[dict[str, str], dict[str, set[str]]]:
        """The upload's trace of each document, and the stages of that document found in it."""
        spans = [json.loads(line) for line in observed.traces.read_text().splitlines()]
        uploads = {
            s["attributes"]["request_id"]: s["context"]["trace_id"]
            for s in spans
            if s["name"] == "POST /v1/kbs/{kb_id}/documents" and "request_id" in s["attributes"]
        }
        prefix = load["request_id"].removesuffix("-0")
        trace_of = {name: uploads.get(f"{prefix}-{i}", "") for i, name in enumerate(load["names"])}
        seen: dict[str, set[str]] = {name: set() for name in load["names"]}
        for s in spans:
            doc = s["attributes"].get("doc_id")
            if doc in seen and s["context"]["trace_id"] == trace_of[doc] and s["name"] in stages:
                seen[doc].add(s["name"])
        return trace_of, seen

    deadline = time.monotonic() + 60  # a stage's span is written when its task ends, after `ready`
    trace_of, seen = traced()
    while any(v != stages for v in seen.values()) and time.monotonic() < deadline:
        time.sleep(0.5)
        trace_of, seen = traced()
    assert all(trace_of.values()), "an upload has no request span"
    assert len(set(trace_of.values())) == DOCS
    assert {doc: sorted(stages - got) for doc, got in seen.items() if got != stages} == {}

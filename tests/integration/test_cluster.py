"""Beyond one node: a 2-node OpenSearch cluster that loses a node mid-load, and workers split by stage.

The module starts its own stack with the project's scripts, on free ports and in its own state dir:
a 2-node cluster (replicas 1), Redis, and two workers from the same code and configuration, one
on the parse-heavy queues and one on the embed-heavy ones (embed and store routed to
`<queue>-embed`). It stops all of it at the end. Sizes: RAGLINE_TEST_CLUSTER_DOCS documents for
the failover load (200, the issue's "few hundred", in `make test`; `make soak` runs 500), a tenth
of that (at least 10) for the queue test.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from opensearchpy import OpenSearch
from opensearchpy.exceptions import TransportError

from shared.config import Settings, load_settings
from shared.ingest import Ingestor
from shared.models import DocStatus, KnowledgeBase
from shared.queue import all_queues, lane_queues
from shared.registry import Registry
from shared.search.requests import SearchRequest
from shared.search.schema import chunks_alias, docs_index
from shared.search.searcher import Searcher
from shared.wiring import build_services
from tests.integration.helpers import new_kb, wait_terminal
from workers.leader import dead_here
from workers.reconciler import EPOCH_KEY
from workers.tasks import FEEDER_LEASE, RECONCILER_LEASE

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "deploy" / "local"
NODES = 2
LOAD_DOCS = int(os.environ.get("RAGLINE_TEST_CLUSTER_DOCS", "200"))
PARSE_WORKER, EMBED_WORKER = "worker-parse", "worker-embed"
EMBED_QUEUES = "interactive-embed,bulk-embed"


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports() -> tuple[int, int, int]:
    """HTTP and transport port blocks for the nodes, and a Redis port, away from every stack's defaults."""
    for base in random.sample(range(20000, 29000, 10), 200):
        ports = [base + i for i in range(NODES)] + [base + 100 + i for i in range(NODES)] + [base + 5]
        if all(_free(p) for p in ports):
            return base, base + 100, base + 5
    raise AssertionError("no free ports for the test cluster")


@dataclass
class ClusterStack:
    env: dict[str, str]
    settings: Settings
    client: OpenSearch
    broker: redis.Redis
    registry: Registry
    ingestor: Ingestor
    log: list[str] = field(default_factory=list)

    def script(self, name: str, *args: str) -> str:
        """Run deploy/local/NAME.sh with the stack's environment; fail the test with its output."""
        started = time.monotonic()
        done = subprocess.run(
            ["bash", str(SCRIPTS / f"{name}.sh"), *args],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        output = done.stdout + done.stderr
        self.log.append(f"{name}.sh {' '.join(args)} ({time.monotonic() - started:.0f} s):\n{output}")
        if done.returncode != 0:
            pytest.fail(f"{name}.sh {' '.join(args)} failed (rc {done.returncode}):\n{output}")
        return output

    def node_of_manager(self) -> int:
        name = self.client.cat.cluster_manager(h="node").strip()
        return int(name.rsplit("-", 1)[1])

    def wait_green(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                # The server waits up to 30 s for green, then answers with the status it has.
                if (
                    self.client.cluster.health(wait_for_status="green", request_timeout=45)["status"]
                    == "green"
                ):
                    return
            except TransportError as error:
                print(f"cluster health did not answer ({error}); asking again")
                time.sleep(1)
        pytest.fail(f"cluster not green after {timeout_s}s: {self.client.cluster.health()}")

    def wait_first_reconcile(self, timeout_s: float = 120) -> None:
        """Until the reconciler's first round marks the broker's epoch, any unfinished document
        would look like work a flushed broker lost, and be sent again."""
        deadline = time.monotonic() + timeout_s
        while not self.broker.exists(EPOCH_KEY):
            assert time.monotonic() < deadline, f"no reconciler round within {timeout_s}s of the start"
            time.sleep(0.5)

    def depth(self, queue: str) -> int:
        return int(self.broker.llen(queue))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    # A path as users name them (spaces, quotes, " #" and ": ", a backslash, "%p", a letter outside
    # ASCII, glob characters): the scripts write it into Redis's and OpenSearch's configuration,
    # the JVM's options and Celery's pid file, and find the services by it under the C locale.
    state = tmp_path_factory.mktemp('cluster "stack" #2: nodes\\ü%p [z]*?')
    http, transport, redis_port = _free_ports()
    urls = ",".join(f"http://127.0.0.1:{http + i}" for i in range(NODES))
    overrides = {
        "RAGLINE_STATE_DIR": str(state),
        "RAGLINE_OPENSEARCH_NODES": str(NODES),
        "RAGLINE_OPENSEARCH_PORT": str(http),
        "RAGLINE_OPENSEARCH_TRANSPORT_PORT": str(transport),
        "RAGLINE_OPENSEARCH_HEAP": "512m",
        "RAGLINE_OPENSEARCH__URL": urls,
        "RAGLINE_OPENSEARCH__REPLICAS": "1",
        "RAGLINE_REDIS_PORT": str(redis_port),
        "RAGLINE_REDIS__URL": f"redis://127.0.0.1:{redis_port}/0",
        "RAGLINE_CELERY__STAGE_QUEUES": '{"embed": "{queue}-embed", "store": "{queue}-embed"}',
        "RAGLINE_WORKERS": f"{PARSE_WORKER}=interactive,bulk {EMBED_WORKER}={EMBED_QUEUES}",
        "RAGLINE_METRICS__WORKER_PORT": "0",  # two workers here, and maybe a stack's worker beside them
        "HF_HUB_OFFLINE": "1",
        "LC_ALL": "C",
    }
    env = {**os.environ, **overrides}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in overrides.items():
            patch.setenv(name, value)
        settings = load_settings()
    services = build_services(settings)
    cluster = ClusterStack(
        env, settings, services.client, services.redis, services.registry, services.ingestor
    )
    try:
        cluster.script("stack", "up", "opensearch", "redis", "worker")
        services.prepare_indexes()
        cluster.wait_green()
        cluster.wait_first_reconcile()
        yield cluster
    finally:
        subprocess.run(
            ["bash", str(SCRIPTS / "stack.sh"), "down", "opensearch", "redis", "worker"],
            env=env,
            cwd=REPO,
            capture_output=True,
            timeout=300,
            check=False,
        )
        shutil.rmtree(state, ignore_errors=True)


def _submit(stack: ClusterStack, kb: KnowledgeBase, count: int, prefix: str) -> list[str]:
    names = [f"{prefix}-{i}.txt" for i in range(count)]
    for i, name in enumerate(names):
        text = f"Logbook {prefix} {i}: the ferry number {i * 7} docked at pier {i % 13} after the storm.\n"
        # Bulk by choice: single small documents would take the tenant's interactive quota, whose
        # queues the assertions on the bulk lane do not count.
        stack.ingestor.submit(kb.tenant_id, kb.kb_id, text.encode(), filename=name, priority="bulk")
    return names


def _statuses(stack: ClusterStack, kb: KnowledgeBase) -> Counter[str]:
    stack.client.indices.refresh(index=docs_index(stack.settings))
    response = stack.client.search(
        index=docs_index(stack.settings),
        body={
            "size": 0,
            "query": {
                "bool": {"filter": [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"kb_id": kb.kb_id}}]}
            },
            "aggs": {"status": {"terms": {"field": "status", "size": 20}}},
        },
    )
    return Counter({b["key"]: b["doc_count"] for b in response["aggregations"]["status"]["buckets"]})


class SearchLoop(threading.Thread):
    """Hybrid searches back to back, as a user would send them; counts the ones that failed."""

    def __init__(self, stack: ClusterStack, kb: KnowledgeBase) -> None:
        super().__init__(daemon=True)
        self.searcher = Searcher(stack.client, stack.settings)
        self.kb = kb
        self.done = threading.Event()
        self.answered = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.done.is_set():
            try:
                request = SearchRequest(query=f"ferry docked at pier {random.randrange(13)}", top_k=5)
                self.searcher.search(self.kb.tenant_id, [self.kb.kb_id], request)
                self.answered += 1
            except Exception as error:  # noqa: BLE001  (every failure a user would see counts)
                self.failures.append(f"{type(error).__name__}: {error}")
            time.sleep(0.2)


def _wait_ready_count(stack: ClusterStack, kb: KnowledgeBase, at_least: int, timeout_s: float = 600) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready = _statuses(stack, kb)[DocStatus.READY.value]
        if ready >= at_least:
            return ready
        time.sleep(1)
    pytest.fail(f"fewer than {at_least} documents ready after {timeout_s}s: {_statuses(stack, kb)}")


def _indexed_chunks(stack: ClusterStack, kb: KnowledgeBase) -> list[dict[str, Any]]:
    alias = chunks_alias(stack.settings)
    stack.client.indices.refresh(index=alias)
    filters = [{"term": {"tenant_id": kb.tenant_id}}, {"term": {"kb_id": kb.kb_id}}]
    response = stack.client.search(
        index=alias,
        body={
            "size": 10_000,
            "query": {"bool": {"filter": filters}},
            "_source": ["doc_id", "generation", "chunk_idx", "chunk_id"],
        },
    )
    return [hit["_source"] | {"_id": hit["_id"]} for hit in response["hits"]["hits"]]


@pytest.mark.timeout(1200)  # the module's stack starts inside the first test's time
def test_indexes_carry_the_configured_replicas(stack: ClusterStack) -> None:
    for index in (docs_index(stack.settings), chunks_alias(stack.settings)):
        for name, body in stack.client.indices.get_settings(index=index).items():
            assert body["settings"]["index"]["number_of_replicas"] == "1", name
    shards = stack.client.cat.shards(format="json")
    nodes_by_index: dict[str, set[str]] = {}
    for shard in shards:
        nodes_by_index.setdefault(shard["index"], set()).add(shard["node"])
    # Every index has a copy on each node, so either node can go.
    assert all(len(nodes) == NODES for nodes in nodes_by_index.values()), nodes_by_index


def _held_at_embed_stage(stack: ClusterStack, kb: KnowledgeBase) -> list[str]:
    """With the embed worker stopped, a small load that the parse worker takes up to the embed stage."""
    count = max(10, LOAD_DOCS // 10)
    names = _submit(stack, kb, count, "queued")
    # The parse worker takes documents up to the embed stage, where they wait: the feeder admits no
    # more once the bulk lane's queues (bulk and bulk-embed together) hold its depth.
    deadline = time.monotonic() + 300
    while True:
        statuses = _statuses(stack, kb)
        in_flight = sum(n for s, n in statuses.items() if s not in ("queued", "embedding"))
        waiting = stack.depth("bulk-embed")
        if statuses["embedding"] and in_flight == 0 and stack.depth("bulk") == 0 and waiting:
            break
        assert time.monotonic() < deadline, f"never settled at the embed stage: {statuses}"
        time.sleep(1)
    time.sleep(5)  # long enough for any stray consumer of bulk-embed to show itself
    statuses = _statuses(stack, kb)
    print(f"\nembed worker stopped: {dict(statuses)}, bulk-embed depth {stack.depth('bulk-embed')}")
    assert statuses[DocStatus.READY.value] == 0
    # One message per waiting document: a stopped worker is not taken for a dead one (whose
    # death would send every unfinished document again).
    assert statuses[DocStatus.EMBEDDING.value] == stack.depth("bulk-embed") > 0
    return names


@pytest.mark.timeout(1200)  # the module's stack starts inside the first test's time
def test_a_stopped_worker_leaves_its_queue_waiting_and_its_restart_drains_it(stack: ClusterStack) -> None:
    kb = new_kb(stack.registry, pii_policy="off")
    stack.script("worker", "stop", EMBED_WORKER)
    # A clean stop hands the periodic jobs over: no lease stays with a process that is gone.
    holders = [stack.broker.get(lease) for lease in (RECONCILER_LEASE, FEEDER_LEASE)]
    assert not any(isinstance(h, bytes) and dead_here(h.decode()) for h in holders), holders
    try:
        names = _held_at_embed_stage(stack, kb)
    finally:
        stack.script("worker", "start", EMBED_WORKER)  # whatever happened, the next test needs both
    docs = wait_terminal(stack.registry, kb, names, timeout_s=600)
    assert {d.status for d in docs.values()} == {DocStatus.READY}
    # A document an embedding batch took along leaves its own task queued, which finds it moved
    # on and does nothing: such tasks may still wait when the last document is ready (CI saw one).
    deadline = time.monotonic() + 120
    while depths := {q: n for q in all_queues(stack.settings) if (n := stack.depth(q))}:
        assert time.monotonic() < deadline, f"the queues never drained: {depths}"
        time.sleep(1)


@pytest.mark.timeout(2400)
def test_a_node_stopped_and_restarted_mid_load_loses_nothing(stack: ClusterStack) -> None:
    kb = new_kb(stack.registry, pii_policy="off")
    stack.wait_green()
    searches = SearchLoop(stack, kb)
    searches.start()
    names = _submit(stack, kb, LOAD_DOCS, "load")
    _wait_ready_count(stack, kb, LOAD_DOCS // 5)

    # The elected cluster manager goes: the harder case (the other node must take over the vote).
    victim = stack.node_of_manager()
    stack.script("opensearch", "stop-node", str(victim))
    # Counted once the node is gone: the load went on while it shut down, which takes seconds.
    answered_before = searches.answered
    ready_before = _statuses(stack, kb)[DocStatus.READY.value]
    print(f"node {victim} (the cluster manager) stopped with {ready_before}/{LOAD_DOCS} ready")
    # The load goes on with one node left, and searches are answered.
    ready_alone = _wait_ready_count(stack, kb, min(LOAD_DOCS, ready_before + LOAD_DOCS // 10))
    deadline = time.monotonic() + 120
    while searches.answered == answered_before and time.monotonic() < deadline:
        time.sleep(0.5)
    health = stack.client.cluster.health()
    print(f"{ready_alone} ready with one node ({health['status']}, {health['number_of_nodes']} node)")
    assert health["number_of_nodes"] == NODES - 1
    answered_alone = searches.answered - answered_before

    stack.script("opensearch", "start-node", str(victim))
    stack.wait_green()

    docs = wait_terminal(stack.registry, kb, names, timeout_s=900)
    searches.done.set()
    searches.join(timeout=60)
    assert {d.status for d in docs.values()} == {DocStatus.READY}, Counter(d.status for d in docs.values())
    assert searches.failures == [], searches.failures[:5]
    assert answered_alone > 0

    chunks = _indexed_chunks(stack, kb)
    assert len({c["_id"] for c in chunks}) == len(chunks)  # no duplicates
    by_doc: dict[str, list[dict[str, Any]]] = {}
    for chunk in chunks:
        by_doc.setdefault(chunk["doc_id"], []).append(chunk)
    assert set(by_doc) == set(names)  # nothing lost
    for name, doc in docs.items():
        assert sorted(c["chunk_idx"] for c in by_doc[name]) == list(range(doc.chunk_count)), name
        assert {c["generation"] for c in by_doc[name]} == {doc.active_generation}, name
    # Each one-line document is one chunk.
    assert len(chunks) == sum(d.chunk_count for d in docs.values()) == LOAD_DOCS
    assert all(stack.depth(queue) == 0 for queue in lane_queues(stack.settings, "bulk"))
    assert stack.client.cluster.health()["status"] == "green"

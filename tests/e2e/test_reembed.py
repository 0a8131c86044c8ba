"""`ragline kb reembed` under search traffic: no failed search, every chunk on the new model.

Real stack, real worker, the real CLI command: a KB on the default model moves to
all-mpnet-base-v2 (another PyPI-packaged model, 768 dimensions) while a thread searches it without
pause and a document is uploaded mid-way; then it moves back to all-MiniLM-L6-v2, which drops the
KB's own mpnet index.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from collections import Counter
from typing import Any

import httpx
import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.embedding import embedded_text, encoder, for_model
from shared.search.client import build_client
from shared.search.placement import kb_alias, kb_index_pattern, kb_scope, resolve
from shared.search.schema import VECTOR_FIELDS, chunks_index
from tests.e2e.helpers import RAGLINE, TOPICS, Server, tenant_of, wait_for_reembed, wait_ready
from tests.integration.stored_vectors import chunk_filter, mean_direction, stored_cosine

pytestmark = pytest.mark.e2e

SECOND_MODEL = "all-mpnet-base-v2"
LATE = ("bees.txt", "Insects\n\nHoney bees dance to tell the hive where the flowers with nectar are.\n")
QUERIES = {  # paraphrases sharing few words with their document: the k-NN arm must carry them
    "garden.txt": "growing tomato plants outdoors",
    "rockets.txt": "propellants of a space launcher",
    "bread.txt": "leavened loaf made with natural ferment",
    "tides.txt": "why sea level rises and falls each day",
}
MAX_TRAFFIC_S = 900  # the search loop stops by itself even if the test fails to stop it


class Traffic(threading.Thread):
    """Searches the KB without pause; counts answers, failures and empty answers."""

    def __init__(self, server: Server, kb: str) -> None:
        super().__init__(daemon=True)
        self.server, self.kb = server, kb
        self.stop = threading.Event()
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []

    def run(self) -> None:
        deadline = time.monotonic() + MAX_TRAFFIC_S
        queries = list(QUERIES.values())
        with self.server.client("a_read") as client:
            while not self.stop.is_set() and time.monotonic() < deadline:
                query = queries[self.counts["sent"] % len(queries)]
                self.counts["sent"] += 1
                try:
                    response = client.post("/v1/search", json={"query": query, "kb_ids": [self.kb]})
                except httpx.HTTPError as error:
                    self.failures.append(f"{type(error).__name__}: {error}")
                    continue
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code}: {response.text[:300]}")
                elif not response.json()["results"]:
                    self.counts["empty"] += 1
                else:
                    self.counts["answered"] += 1


def _reembed(server: Server, kb: str, model: str) -> tuple[dict[str, Any], float]:
    """Run the CLI command like a user (it waits until the new index is live)."""
    env = {**os.environ, "RAGLINE_SERVER": server.url, "RAGLINE_API_KEY": server.keys["a_admin"]}
    started = time.perf_counter()
    done = subprocess.run(
        [RAGLINE, "kb", "reembed", kb, "--model", model],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout), elapsed


def _chunks(client: OpenSearch, index: str, tenant: str, kb: str) -> list[dict[str, Any]]:
    client.indices.refresh(index=index)
    body = {"size": 1000, "query": kb_scope(tenant, kb), "_source": True}
    return [h["_source"] for h in client.search(index=index, body=body)["hits"]["hits"]]


def _check_vectors(client: OpenSearch, settings: Settings, tenant: str, kb: str, model: str) -> str:
    """Every chunk of the KB sits in an index of `model`, with `model`'s vector of its text."""
    placement = resolve(client, settings, [(tenant, kb)])[(tenant, kb)]
    assert placement.model == model
    model_encoder = encoder(for_model(settings.embedding, model))
    mapping = client.indices.get_mapping(index=placement.index)[placement.index]["mappings"]
    assert mapping["properties"]["embedding"]["dimension"] == model_encoder.dimension
    alias = kb_alias(settings, tenant, kb)
    chunks = _chunks(client, alias, tenant, kb)
    # Vectors are kept out of `_source`: the k-NN search scores each stored one against a fresh
    # encoding of its chunk's text (tests/integration/stored_vectors.py).
    assert not any(field in c for c in chunks for field in VECTOR_FIELDS)
    fresh = model_encoder.encode([embedded_text(c) for c in chunks])
    cosines = [
        stored_cosine(client, alias, "embedding", chunk_filter(tenant, kb, c), vector)
        for c, vector in zip(chunks, fresh, strict=True)
    ]
    lowest = min(c or 0.0 for c in cosines)
    print(f"{model}: {len(chunks)} chunks in {placement.index}, cosine to a fresh encoding min {lowest:.6f}")
    assert lowest > 0.999
    # Each document's first chunk, and no other, carries the normalized mean of its chunks' vectors
    # in this model.
    by_document: dict[tuple[str, int], list[tuple[dict[str, Any], Any]]] = {}
    for chunk, vector in zip(chunks, fresh, strict=True):
        by_document.setdefault((chunk["doc_id"], chunk["generation"]), []).append((chunk, vector))
    for key, members in by_document.items():
        mean = mean_direction([vector for _, vector in members])
        cosines = [
            stored_cosine(client, alias, "document_embedding", chunk_filter(tenant, kb, c), mean)
            for c, _ in members
        ]
        carriers = [
            c["chunk_idx"] for (c, _), cosine in zip(members, cosines, strict=True) if cosine is not None
        ]
        assert carriers == [min(c["chunk_idx"] for c, _ in members)], key
        assert max(c or 0.0 for c in cosines) > 0.999, key
    mapping_of_document = mapping["properties"]["document_embedding"]
    assert mapping_of_document["dimension"] == model_encoder.dimension
    return placement.index


def test_reembed_under_search_traffic(server: Server, settings: Settings) -> None:
    client = build_client(settings.opensearch)
    tenant = tenant_of(server, "a_admin")
    kb = f"kb-reembed-{uuid.uuid4().hex[:6]}"
    with server.client("a_admin") as api:
        assert (
            api.post("/v1/kbs", json={"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}).status_code
            == 201
        )
        files = [("files", (name, text.encode(), "text/plain")) for name, text in TOPICS.items()]
        assert api.post(f"/v1/kbs/{kb}/documents", files=files).status_code == 202
        assert {d["status"] for d in wait_ready(api, kb, list(TOPICS)).values()} == {"ready"}
        view = api.get(f"/v1/kbs/{kb}").json()
        assert (view["embedding_model"], view["embedding_dimension"]) == (settings.embedding.model, 384)
        assert view["reembed"] is None
        _check_vectors(client, settings, tenant, kb, settings.embedding.model)

        # Unknown model and a second reembed while one runs are refused with stable codes.
        refused = api.post(f"/v1/kbs/{kb}/reembed", json={"model": "no-such-model"})
        assert (refused.status_code, refused.json()["code"]) == (422, "INVALID_ARGUMENT")

        traffic = Traffic(server, kb)
        traffic.start()
        try:
            # First move through REST, with a document uploaded while it runs.
            before, started = traffic.counts["sent"], time.perf_counter()
            accepted = api.post(f"/v1/kbs/{kb}/reembed", json={"model": SECOND_MODEL})
            assert accepted.status_code == 202, accepted.text
            assert accepted.json()["reembed"]["model"] == SECOND_MODEL
            late = [("files", (LATE[0], LATE[1].encode(), "text/plain"))]
            assert api.post(f"/v1/kbs/{kb}/documents", files=late).status_code == 202
            again = api.post(f"/v1/kbs/{kb}/reembed", json={"model": SECOND_MODEL})
            assert (again.status_code, again.json()["code"]) == (409, "CONFLICT")
            view = wait_for_reembed(api, kb)
            first_s, during_first = time.perf_counter() - started, traffic.counts["sent"] - before
            assert (view["embedding_model"], view["embedding_dimension"]) == (SECOND_MODEL, 768)
            assert view["reembed"] is None
            assert view["reembed_error"] is None
            assert wait_ready(api, kb, [LATE[0]])[LATE[0]]["status"] == "ready"
            mpnet_index = _check_vectors(client, settings, tenant, kb, SECOND_MODEL)
            # The shared index of the default model kept no chunk of the KB (after the grace period).
            shared = chunks_index(settings, settings.embedding.model)
            _wait_for(
                lambda: not _chunks(client, shared, tenant, kb), "the KB's chunks left the shared index"
            )

            # Second move with the CLI, back to the default model: the KB's mpnet index goes.
            before = traffic.counts["sent"]
            view, second_s = _reembed(server, kb, settings.embedding.model)
            during_second = traffic.counts["sent"] - before
            assert (view["embedding_model"], view["embedding_dimension"]) == (settings.embedding.model, 384)
            _check_vectors(client, settings, tenant, kb, settings.embedding.model)
            _wait_for(lambda: not client.indices.exists(index=mpnet_index), f"{mpnet_index} was dropped")
        finally:
            traffic.stop.set()
            traffic.join(timeout=60)

        print(
            f"reembed to {SECOND_MODEL}: {first_s:.1f}s, {during_first} searches meanwhile; "
            f"back to {settings.embedding.model}: {second_s:.1f}s, {during_second} searches meanwhile; "
            f"searches: {dict(traffic.counts)}, failed: {len(traffic.failures)}"
        )
        assert traffic.failures == []
        assert traffic.counts["empty"] == 0
        assert during_first > 0
        assert during_second > 0

        docs = {d: api.get(f"/v1/kbs/{kb}/documents/{d}").json() for d in [*TOPICS, LATE[0]]}
        total = sum(int(d["chunk_count"]) for d in docs.values())
        assert len(_chunks(client, kb_alias(settings, tenant, kb), tenant, kb)) == total
        for expected, query in {**QUERIES, LATE[0]: "pollinating insects communicating"}.items():
            hits = api.post("/v1/search", json={"query": query, "kb_ids": [kb], "mode": "similarity"}).json()
            assert hits["results"][0]["doc_id"] == expected, (query, hits["results"][:2])
        assert api.delete(f"/v1/kbs/{kb}").status_code == 204
    assert client.indices.get(index=kb_index_pattern(settings, tenant, kb)) == {}


def _wait_for(condition: Any, what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    pytest.fail(f"not true after {timeout_s}s: {what}")

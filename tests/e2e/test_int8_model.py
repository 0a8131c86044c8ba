"""The int8 variant of the default model is a model of its own: a KB created on it, or reembedded to
it, keeps its vectors in an index of its own and is searched with int8 query vectors, and a reembed
moves a KB from fp32 to int8 and back.

Real stack and worker, the API started by the tests. Which model made a stored vector is told by
the k-NN score itself (tests/integration/stored_vectors.py): the fresh encoding of the chunk's text
by that model scores (1 + 1) / 2, the other model's does not. The query vector a search used is
told the same way: each hit's k-NN arm score is its stored vector scored with its KB model's query vector.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from typing import Any

import httpx
import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.embedding import INT8_MODELS, embedded_text, encoder, for_model
from shared.search import chunk_index
from shared.search.client import build_client
from shared.search.placement import kb_alias, kb_index_pattern, kb_scope, resolve
from shared.search.schema import chunks_index
from tests.e2e.helpers import RAGLINE, TOPICS, Server, tenant_of, wait_for_reembed, wait_ready
from tests.integration.stored_vectors import chunk_filter, stored_cosine

pytestmark = pytest.mark.e2e

INT8 = "all-MiniLM-L6-v2-int8"
QUERY = "propellants of a space launcher"


def _create(api: httpx.Client, kb: str, model: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"kb_id": kb, "name": kb, "settings": {"pii_policy": "off"}}
    if model is not None:
        body["embedding_model"] = model
    created = api.post("/v1/kbs", json=body)
    assert created.status_code == 201, created.text
    view: dict[str, Any] = created.json()
    return view


def _load(api: httpx.Client, kb: str) -> None:
    files = [("files", (name, text.encode(), "text/plain")) for name, text in TOPICS.items()]
    assert api.post(f"/v1/kbs/{kb}/documents", files=files).status_code == 202
    assert {d["status"] for d in wait_ready(api, kb, list(TOPICS)).values()} == {"ready"}


def _chunks(client: OpenSearch, settings: Settings, tenant: str, kb: str) -> list[dict[str, Any]]:
    alias = kb_alias(settings, tenant, kb)
    client.indices.refresh(index=alias)
    body = {"size": 1000, "query": kb_scope(tenant, kb), "_source": True}
    return [h["_source"] for h in client.search(index=alias, body=body)["hits"]["hits"]]


def _encode(settings: Settings, model: str, texts: list[str]) -> Any:
    return encoder(for_model(settings.embedding, model)).encode(texts)


def _check_own_model(client: OpenSearch, settings: Settings, tenant: str, kb: str, model: str) -> str:
    """Every chunk of the KB has `model`'s vector (not the other variant's), in an index of `model`."""
    other = INT8 if model != INT8 else INT8_MODELS[INT8].model
    placement = resolve(client, settings, [(tenant, kb)])[(tenant, kb)]
    assert placement.model == model
    chunks = _chunks(client, settings, tenant, kb)
    assert len(chunks) >= len(TOPICS)
    texts = [embedded_text(c) for c in chunks]
    alias = kb_alias(settings, tenant, kb)
    for chunk, mine, theirs in zip(
        chunks, _encode(settings, model, texts), _encode(settings, other, texts), strict=True
    ):
        where = chunk_filter(tenant, kb, chunk)
        own, foreign = (
            stored_cosine(client, alias, "embedding", where, mine),
            stored_cosine(client, alias, "embedding", where, theirs),
        )
        assert own is not None
        assert foreign is not None
        if model == INT8:
            # Dynamic quantization scales each batch's activations as a whole, so an int8 vector
            # moves a little with the texts it was encoded beside: close to this encoding, and
            # not the fp32 model's, which no batch moves.
            assert own > 0.99, (chunk["doc_id"], own)
            assert foreign < 0.9999, (chunk["doc_id"], foreign)
        else:
            assert own > 0.9999, (chunk["doc_id"], own)
            assert own > foreign, (chunk["doc_id"], own, foreign)
    return placement.index


def _check_query_vectors(
    api: httpx.Client, client: OpenSearch, settings: Settings, tenant: str, models: dict[str, str]
) -> None:
    """A similarity search over the KBs scores each hit with its own KB's model's query vector."""
    answer = api.post(
        "/v1/search", json={"query": QUERY, "kb_ids": sorted(models), "mode": "similarity", "top_k": 20}
    )
    assert answer.status_code == 200, answer.text
    hits = answer.json()["results"]
    assert {h["kb_id"] for h in hits} == set(models)
    chunks = {
        (kb, c["doc_id"], c["chunk_idx"]): c for kb in models for c in _chunks(client, settings, tenant, kb)
    }
    queries = {m: _encode(settings, m, [QUERY])[0] for m in (INT8, INT8_MODELS[INT8].model)}
    own_gap, foreign_gap = 0.0, 0.0
    for hit in hits:
        model = models[hit["kb_id"]]
        other = INT8 if model != INT8 else INT8_MODELS[INT8].model
        where = chunk_filter(tenant, hit["kb_id"], chunks[(hit["kb_id"], hit["doc_id"], hit["chunk_idx"])])
        alias = kb_alias(settings, tenant, hit["kb_id"])
        # The hit's score against the stored vector, scored again with each model's query vector.
        own = stored_cosine(client, alias, "embedding", where, queries[model])
        foreign = stored_cosine(client, alias, "embedding", where, queries[other])
        assert own is not None
        assert foreign is not None
        measured = 2 * hit["semantic"]["score"] - 1
        own_gap = max(own_gap, abs(measured - own))
        foreign_gap = max(foreign_gap, abs(measured - foreign))
    assert own_gap < 1e-4, own_gap
    assert foreign_gap > 1e-3, foreign_gap  # the other model's query vector would score otherwise


def test_a_kb_created_on_int8_has_its_own_index_and_int8_queries(server: Server, settings: Settings) -> None:
    client = build_client(settings.opensearch)
    tenant = tenant_of(server, "a_admin")
    suffix = uuid.uuid4().hex[:6]
    kb_int8, kb_fp32 = f"kb-int8-{suffix}", f"kb-fp32-{suffix}"
    with server.client("a_admin") as api:
        unknown = api.post(
            "/v1/kbs", json={"kb_id": f"kb-none-{suffix}", "name": "x", "embedding_model": "nope"}
        )
        assert (unknown.status_code, unknown.json()["code"]) == (422, "INVALID_ARGUMENT")
        assert INT8 in unknown.json()["details"]["known"]
        assert api.get(f"/v1/kbs/kb-none-{suffix}").status_code == 404

        view = _create(api, kb_int8, INT8)
        assert (view["embedding_model"], view["embedding_dimension"]) == (INT8, 384)
        assert _create(api, kb_fp32)["embedding_model"] == settings.embedding.model
        _load(api, kb_int8)
        _load(api, kb_fp32)

        index = _check_own_model(client, settings, tenant, kb_int8, INT8)
        assert index in client.indices.get(index=kb_index_pattern(settings, tenant, kb_int8))
        assert index != chunks_index(settings, settings.embedding.model)
        _check_own_model(client, settings, tenant, kb_fp32, settings.embedding.model)
        _check_query_vectors(
            api, client, settings, tenant, {kb_int8: INT8, kb_fp32: settings.embedding.model}
        )
        # The bench reads a KB's chunk texts by id, wherever its index: the int8 KB's is under
        # no shared alias.
        for kb in (kb_int8, kb_fp32):
            assert chunk_index.kb_tenant(client, settings, kb) == tenant
            texts = chunk_index.kb_chunk_texts(client, settings, kb)
            assert sorted(texts) == sorted(embedded_text(c) for c in _chunks(client, settings, tenant, kb))

        # The CLI creates one the same way, ready for documents in an index of the model.
        kb_cli = f"kb-int8-cli-{suffix}"
        done = _cli(server, "kb", "create", kb_cli, "--model", INT8)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["embedding_model"] == INT8
        assert resolve(client, settings, [(tenant, kb_cli)])[(tenant, kb_cli)].model == INT8

        for kb in (kb_int8, kb_fp32, kb_cli):
            assert api.delete(f"/v1/kbs/{kb}").status_code == 204
    for kb in (kb_int8, kb_cli):
        assert client.indices.get(index=kb_index_pattern(settings, tenant, kb)) == {}


def _cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAGLINE_SERVER": server.url, "RAGLINE_API_KEY": server.keys["a_admin"]}
    return subprocess.run([RAGLINE, *args], env=env, capture_output=True, text=True, timeout=900, check=False)


def test_reembed_moves_a_kb_from_fp32_to_int8_and_back(server: Server, settings: Settings) -> None:
    client = build_client(settings.opensearch)
    tenant = tenant_of(server, "a_admin")
    kb = f"kb-int8-move-{uuid.uuid4().hex[:6]}"
    fp32 = settings.embedding.model
    with server.client("a_admin") as api:
        _create(api, kb)
        _load(api, kb)
        _check_own_model(client, settings, tenant, kb, fp32)

        accepted = api.post(f"/v1/kbs/{kb}/reembed", json={"model": INT8})
        assert accepted.status_code == 202, accepted.text
        view = wait_for_reembed(api, kb)
        assert (view["embedding_model"], view["embedding_dimension"], view["reembed_error"]) == (
            INT8,
            384,
            None,
        )
        int8_index = _check_own_model(client, settings, tenant, kb, INT8)
        _check_query_vectors(api, client, settings, tenant, {kb: INT8})

        # Back with the CLI, as an operator would.
        done = _cli(server, "kb", "reembed", kb, "--model", fp32)
        assert done.returncode == 0, done.stdout + done.stderr
        _check_own_model(client, settings, tenant, kb, fp32)
        _check_query_vectors(api, client, settings, tenant, {kb: fp32})
        deadline = time.monotonic() + 120
        while client.indices.exists(index=int8_index) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not client.indices.exists(index=int8_index)
        assert api.delete(f"/v1/kbs/{kb}").status_code == 204

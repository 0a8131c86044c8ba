"""MCP `search` takes what REST search takes: the fusion and the arms' weights answer the same
ranking through both fronts, and weights REST refuses MCP refuses with the same code."""

from __future__ import annotations

import uuid
from typing import Any

import anyio
import pytest

from tests.e2e.helpers import Server, call, error_text, http_session, wait_ready

pytestmark = pytest.mark.e2e

DOCS = {
    "puffins.md": "# Puffins\n\nAtlantic puffins dig burrows on grassy cliff tops.",
    "gannets.md": "# Gannets\n\nNorthern gannets plunge-dive from thirty metres for fish.",
    "eiders.md": "# Eiders\n\nCommon eiders line their nests with down plucked from the breast.",
}


async def _mcp(server: Server, kb: str, arguments: dict[str, Any]) -> tuple[list[str], str]:
    async with http_session(server, "a_admin") as session:
        bad = await session.call_tool("search", {"query": "birds", "kb_ids": [kb], "weights": {"bogus": 1}})
        hits = await call(session, "search", **arguments)
    return [h["doc_id"] for h in hits["results"]], error_text(bad)


def test_fusion_and_weights_rank_alike_through_mcp_and_rest(server: Server) -> None:
    client = server.client("a_admin")
    kb = f"parity-{uuid.uuid4().hex[:6]}"
    assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
    for doc_id, text in DOCS.items():
        body = {"content": text, "doc_id": doc_id, "filename": doc_id}
        assert client.post(f"/v1/kbs/{kb}/documents", json=body).status_code == 202
    wait_ready(client, kb, list(DOCS))
    request = {
        "query": "which seabird dives for fish",
        "kb_ids": [kb],
        "fusion": "rrf",
        "weights": {"keyword": 1, "semantic": 3},
    }
    rest = client.post("/v1/search", json=request)
    assert rest.status_code == 200, rest.text
    via_mcp, refusal = anyio.run(_mcp, server, kb, request)
    assert via_mcp == [h["doc_id"] for h in rest.json()["results"]]
    assert via_mcp[0] == "gannets.md"
    assert refusal.startswith("INVALID_ARGUMENT: "), refusal
    bad = client.post("/v1/search", json={**request, "weights": {"bogus": 1}})
    assert bad.status_code == 422, bad.text
    assert bad.json()["code"] == "INVALID_ARGUMENT"


async def _read_document(server: Server, kb: str, doc_id: str) -> dict[str, Any]:
    async with http_session(server, "a_admin") as session:
        return await call(session, "read_document", kb_id=kb, doc_id=doc_id, chunk_idx=0, window=1)


def test_rest_reads_a_documents_chunks_as_mcp_read_document_does(server: Server) -> None:
    client = server.client("a_admin")
    kb = f"chunks-{uuid.uuid4().hex[:6]}"
    assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
    doc_id = "notes/ends/chunks"  # an id a path route could not tell from a sub-resource
    body = {"content": DOCS["puffins.md"], "doc_id": doc_id, "filename": "puffins.md"}
    assert client.post(f"/v1/kbs/{kb}/documents", json=body).status_code == 202
    wait_ready(client, kb, [doc_id])
    rest = client.get(f"/v1/kbs/{kb}/chunks", params={"doc_id": doc_id, "chunk_idx": 0, "window": 1})
    assert rest.status_code == 200, rest.text
    assert rest.json() == anyio.run(_read_document, server, kb, doc_id)
    assert "puffins" in rest.json()["chunks"][0]["text"].lower()
    missing = client.get(f"/v1/kbs/{kb}/chunks", params={"doc_id": "absent"})
    assert missing.status_code == 404, missing.text
    assert missing.json()["code"] == "NOT_FOUND"
    assert client.get(f"/v1/kbs/{kb}/chunks", params={"doc_id": doc_id, "window": 99}).status_code == 422

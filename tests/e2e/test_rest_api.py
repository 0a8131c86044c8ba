"""The REST API end to end: upload → poll → search, auth, tenants, filters, limits, validation."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx
import pytest

from shared.config import Settings
from tests.e2e.helpers import MAX_FILE_BYTES, Server, wait_ready
from tests.fixtures import samples

pytestmark = pytest.mark.e2e

MIXED = ["page.html", "paper.pdf", "report.docx", "guide.md"]
NEEDLES = {
    "passwords.md": (
        "# Account help\n\nTo recover a forgotten password, open Settings and choose Reset credentials.\n"
    ),
    "tls.txt": (
        "Troubleshooting\n\nThe browser shows ERR_TLS_CERT_ALTNAME_INVALID "
        "when the certificate lacks the host name.\n"
    ),
    "garden.txt": "Gardening\n\nTomatoes need full sun, deep watering and stakes to climb.\n",
    "rockets.txt": "Rocketry\n\nLiquid oxygen and kerosene feed the first stage engines at launch.\n",
}


def _new_kb(client: httpx.Client, kb_id: str | None = None, **settings: Any) -> str:
    kb_id = kb_id or f"kb-{uuid.uuid4().hex[:8]}"
    response = client.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id, "settings": settings})
    assert response.status_code == 201, response.text
    return kb_id


def _search(client: httpx.Client, query: str, **params: Any) -> list[dict[str, Any]]:
    response = client.post("/v1/search", json={"query": query, **params})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["latency_ms"] >= 0
    return list(body["results"])


@pytest.fixture(scope="module")
def mixed_kb(server: Server) -> str:
    with server.client("a_admin") as client:
        kb = _new_kb(client, pii_policy="off")
        files = samples.every_type()
        upload = [("files", (name, files[name][0], "application/octet-stream")) for name in MIXED]
        response = client.post(
            f"/v1/kbs/{kb}/documents", files=upload, data={"metadata": json.dumps({"team": "docs"})}
        )
        assert response.status_code == 202, response.text
        body = response.json()
        assert [d["outcome"] for d in body["documents"]] == ["created"] * len(MIXED)
        needles = [("files", (name, text.encode(), "text/plain")) for name, text in NEEDLES.items()]
        assert client.post(f"/v1/kbs/{kb}/documents", files=needles).status_code == 202
        docs = wait_ready(client, kb, [*MIXED, *NEEDLES])
        assert {d: v["status"] for d, v in docs.items()} == dict.fromkeys([*MIXED, *NEEDLES], "ready")
        # The batch view reads the registry's search side, refreshed each second: poll like a user.
        for _ in range(40):
            batch = client.get(f"/v1/batches/{body['batch_id']}").json()
            if batch["done"]:
                break
            time.sleep(0.25)
        assert batch["total"] == len(MIXED)
        assert batch["done"] is True
        assert batch["counts"] == {"ready": len(MIXED)}
        return kb


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "similarity"])
def test_each_uploaded_document_is_found_by_its_content(server: Server, mixed_kb: str, mode: str) -> None:
    files = samples.every_type()
    with server.client("a_read") as client:
        for name in MIXED:
            phrase = files[name][1]
            hits = _search(client, f"what about {phrase}?", kb_ids=[mixed_kb], mode=mode, top_k=3)
            assert name in [h["doc_id"] for h in hits], (mode, name, [h["doc_id"] for h in hits])
            hit = next(h for h in hits if h["doc_id"] == name)
            for field in (
                "text",
                "score",
                "kb_id",
                "source_uri",
                "title",
                "headings",
                "page_num",
                "page_label",
                "chunk_idx",
                "highlights",
                "keyword",
                "semantic",
            ):
                assert field in hit


def test_meaning_without_shared_words_and_exact_identifiers(server: Server, mixed_kb: str) -> None:
    with server.client("a_read") as client:
        for mode in ("hybrid", "similarity"):
            hits = _search(client, "I can't remember my login secret", kb_ids=[mixed_kb], mode=mode, top_k=3)
            assert hits[0]["doc_id"] == "passwords.md", (mode, [h["doc_id"] for h in hits])
        for mode in ("hybrid", "keyword"):
            hits = _search(client, "ERR_TLS_CERT_ALTNAME_INVALID", kb_ids=[mixed_kb], mode=mode, top_k=3)
            assert hits[0]["doc_id"] == "tls.txt", (mode, [h["doc_id"] for h in hits])
        hybrid = _search(client, "ERR_TLS_CERT_ALTNAME_INVALID", kb_ids=[mixed_kb], top_k=3)[0]
        assert hybrid["keyword"]["rank"] == 1
        assert hybrid["semantic"]["rank"] is not None


def test_filters_max_per_document_and_min_score(server: Server, mixed_kb: str) -> None:
    with server.client("a_read") as client:
        only_pdf = _search(
            client, "chapter text", kb_ids=[mixed_kb], filters={"mime_types": ["application/pdf"]}
        )
        assert only_pdf
        assert {h["doc_id"] for h in only_pdf} == {"paper.pdf"}
        team = _search(
            client, "gardening rockets handbook", kb_ids=[mixed_kb], filters={"metadata": {"team": "docs"}}
        )
        assert team
        assert {h["doc_id"] for h in team} <= set(MIXED)
        prefix = _search(client, "tomatoes", kb_ids=[mixed_kb], filters={"source_prefix": "gard"})
        assert {h["doc_id"] for h in prefix} == {"garden.txt"}
        many = _search(client, "text", kb_ids=[mixed_kb], mode="keyword", top_k=50)
        capped = _search(client, "text", kb_ids=[mixed_kb], mode="keyword", top_k=50, max_per_document=1)
        per_doc = [h["doc_id"] for h in capped]
        assert len(per_doc) == len(set(per_doc))
        assert len(capped) < len(many)
        loose = _search(client, "tomato plants in the sun", kb_ids=[mixed_kb], mode="similarity", top_k=20)
        strict = _search(
            client, "tomato plants in the sun", kb_ids=[mixed_kb], mode="similarity", top_k=20, min_score=0.75
        )
        assert strict
        assert len(strict) < len(loose)
        assert all(h["semantic"]["score"] >= 0.75 for h in strict)
        for fusion in ("min_max", "z_score"):
            fused = _search(
                client,
                "tomatoes need sun",
                kb_ids=[mixed_kb],
                fusion=fusion,
                weights={"keyword": 0.3, "semantic": 0.7},
            )
            assert fused[0]["doc_id"] == "garden.txt"


def _section(heading: str, sentence: str, mention: str) -> str:
    filler = " ".join(f"{sentence} in year {1900 + i}." for i in range(18))
    return f"{heading}\n\n{filler} {mention}\n\n"


def test_document_arms_lift_every_chunk_of_a_document_that_matches_as_a_whole(server: Server) -> None:
    keepers = "The keepers cleaned the large saltwater tank"
    zoo = (
        "Zoo annual report\n\n"
        + _section("Marine wing", keepers, "A narwhal arrived.")
        + _section("Accounts", "The treasurer balanced the ledger of the gift shop", "Tickets sold well.")
        + _section("Australian wing", "The keepers planted eucalyptus along the path", "A quokka was born.")
    )
    aquarium = (
        "Aquarium annual report\n\n"
        + _section("Arctic tank", keepers, "A narwhal arrived.")
        + _section("Accounts", "The treasurer balanced the ledger of the cafe", "Tickets sold well.")
        + _section("Reef tank", "The divers planted coral along the glass", "A clownfish hatched.")
    )
    with server.client("a_admin") as client:
        kb = _new_kb(client, pii_policy="off")
        files = [
            ("files", ("zoo.txt", zoo.encode(), "text/plain")),
            ("files", ("aquarium.txt", aquarium.encode(), "text/plain")),
        ]
        assert client.post(f"/v1/kbs/{kb}/documents", files=files).status_code == 202
        docs = wait_ready(client, kb, ["zoo.txt", "aquarium.txt"])
        assert int(str(docs["zoo.txt"]["chunk_count"])) >= 3
        hybrid = _search(client, "narwhal quokka", kb_ids=[kb], top_k=10)
        # Each of zoo's chunks holds one of the words at most; the document holds both.
        zoo_hits = [h for h in hybrid if h["doc_id"] == "zoo.txt"]
        assert zoo_hits
        assert all(h["document_keyword"]["rank"] == 1 for h in zoo_hits)
        assert all(h["document_semantic"]["rank"] is not None for h in hybrid)
        whole = {"document_keyword": 1}
        by_document = _search(client, "narwhal quokka", kb_ids=[kb], top_k=10, weights=whole)
        assert by_document[0]["doc_id"] == "zoo.txt"
        # The document's share is the same for each of its chunks; the chunk arm tells them apart.
        assert len({h["score"] for h in by_document if h["doc_id"] == "zoo.txt"}) == 1
        by_chunk = _search(client, "narwhal quokka", kb_ids=[kb], top_k=10, weights={"keyword": 1})
        assert len({h["score"] for h in by_chunk if h["doc_id"] == "zoo.txt"}) > 1
        for mode in ("keyword", "similarity"):
            single = _search(client, "narwhal quokka", kb_ids=[kb], mode=mode, top_k=10)
            assert all(h["document_keyword"]["rank"] is None for h in single), mode


def test_a_file_name_is_a_printable_label_whichever_front_brought_it(server: Server) -> None:
    """A multipart name was cleaned; the same name in a JSON upload was stored with its NUL and its
    right-to-left override, which turn a listing into what they please."""
    with server.client("a_admin") as client:
        kb = _new_kb(client)
        body = {"content": "The tide table for March.", "filename": "../tide\x00table\u202etxt.md"}
        accepted = client.post(f"/v1/kbs/{kb}/documents", json=body)
        assert accepted.status_code == 202, accepted.text
        doc_id = accepted.json()["documents"][0]["doc_id"]
        status = client.get(f"/v1/kbs/{kb}/documents/{doc_id}").json()
    assert status["filename"] == "tidetabletxt.md"
    assert doc_id == "tide-table-txt.md"  # the id keeps the name's path safely; these are not kept


def test_oversized_upload_is_refused_and_leaves_nothing(server: Server, settings: Settings) -> None:
    blobs = settings.state_dir / "blobstore" / "blobs"
    before = sum(1 for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else 0
    with server.client("a_admin") as client:
        kb = _new_kb(client)
        big = b"A" * (MAX_FILE_BYTES + 1)
        response = client.post(f"/v1/kbs/{kb}/documents", files=[("files", ("big.txt", big, "text/plain"))])
        assert response.status_code == 413
        assert response.json()["code"] == "TOO_LARGE"
        inline = client.post(f"/v1/kbs/{kb}/documents", json={"content": "B" * (MAX_FILE_BYTES + 1)})
        assert inline.status_code == 413
        assert client.get(f"/v1/kbs/{kb}/documents").json()["documents"] == []
    after = sum(1 for p in blobs.rglob("*") if p.is_file()) if blobs.exists() else 0
    assert after == before


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x", "top_k": 0}, "top_k"),
        ({"query": "x", "top_k": 1000}, "top_k"),
        ({"query": "x", "mode": "magic"}, "mode"),
        ({"query": "x", "filters": {"metadata": {"a": {"range": {}}}}}, "filters"),
        ({"query": "x", "filters": {"metadata": {"a": {"range": {"gte": 10**400}}}}}, "filters"),
        ({"query": "x", "weights": {"keyword": -1}}, "weights"),
        ({"query": "x", "weights": {"title": 1}}, "weights"),
        ({"query": "x", "weights": {"keyword": 0, "document_semantic": 0}}, "weights"),
        ({"query": "x", "surprise": 1}, "surprise"),
    ],
)
def test_bad_search_requests_get_a_422_envelope(server: Server, body: dict[str, Any], field: str) -> None:
    with server.client("a_read") as client:
        response = client.post("/v1/search", json=body)
    assert response.status_code == 422, response.text
    envelope = response.json()
    assert envelope["code"] == "INVALID_ARGUMENT"
    assert any(field in e["field"] for e in envelope["details"]["errors"])


@pytest.mark.parametrize("mode", ["keyword", "hybrid"])
def test_a_query_over_the_engines_clause_limit_is_the_callers_to_shorten(
    server: Server, mixed_kb: str, mode: str
) -> None:
    """Within the length limit, yet more terms than OpenSearch takes clauses: a 503 told clients to
    retry what could never pass, and told operators nothing."""
    query = " ".join(f"term{n}" for n in range(600))
    with server.client("a_read") as client:
        response = client.post("/v1/search", json={"query": query, "mode": mode, "kb_ids": [mixed_kb]})
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "INVALID_ARGUMENT"


def test_other_bad_requests_are_4xx_envelopes(server: Server, mixed_kb: str) -> None:
    with server.client("a_admin") as client:
        cases = [
            client.post("/v1/search", content=b"{not json", headers={"content-type": "application/json"}),
            client.post(  # Python's JSON reads NaN: a NaN weight made every score null
                "/v1/search",
                content=b'{"query": "x", "weights": {"keyword": NaN}}',
                headers={"content-type": "application/json"},
            ),
            client.post(  # an equality filter on NaN matched nothing, with 200, where a range got 422
                "/v1/search",
                content=b'{"query": "x", "filters": {"metadata": {"year": NaN}}}',
                headers={"content-type": "application/json"},
            ),
            client.post("/v1/kbs", json={"kb_id": "../etc", "name": "x"}),
            client.post("/v1/kbs", json={"kb_id": mixed_kb, "name": "again"}),
            client.get("/v1/kbs/unknown-kb"),
            client.get(f"/v1/kbs/{mixed_kb}/documents/no-such-doc"),
            client.get(f"/v1/kbs/{mixed_kb}/documents", params={"cursor": "%%%"}),
            client.get(f"/v1/kbs/{mixed_kb}/documents", params={"limit": 0}),
            client.post(
                f"/v1/kbs/{mixed_kb}/documents", content=b"raw", headers={"content-type": "text/plain"}
            ),
            client.post(f"/v1/kbs/{mixed_kb}/documents", json={"content": ""}),
            client.post(f"/v1/kbs/{mixed_kb}/documents", files=[("other", ("a.txt", b"x"))]),
            client.get("/v1/batches/no-such-batch"),
            client.get("/v1/nowhere"),
        ]
    for response in cases:
        assert 400 <= response.status_code < 500, (response.request.url, response.status_code, response.text)
        assert set(response.json()) == {"code", "message", "details"}


def test_documents_list_paginates_and_delete_and_reingest_work(server: Server, mixed_kb: str) -> None:
    with server.client("a_admin") as client:
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = client.get(f"/v1/kbs/{mixed_kb}/documents", params=params).json()
            seen += [d["doc_id"] for d in page["documents"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted([*MIXED, *NEEDLES])
        assert client.post(f"/v1/kbs/{mixed_kb}/documents/rockets.txt/reingest").status_code == 202
        assert wait_ready(client, mixed_kb, ["rockets.txt"])["rockets.txt"]["content_version"] == 2
        deleted = client.delete(f"/v1/kbs/{mixed_kb}/documents/rockets.txt").json()
        assert deleted["status"] == "deleted"
        assert all(
            h["doc_id"] != "rockets.txt" for h in _search(client, "kerosene liquid oxygen", kb_ids=[mixed_kb])
        )


def test_health_readiness_metrics_and_openapi(server: Server, mixed_kb: str) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        ready = client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert all(check["ok"] for check in ready.json()["checks"].values())
        metrics = client.get("/metrics").text
        for series in (
            "ragline_http_request_duration_seconds_bucket",
            'ragline_documents{status="ready"}',
            'ragline_queue_depth{queue="bulk"}',
            'ragline_stage_duration_seconds_count{stage="parse"}',
        ):
            assert series in metrics, series
        spec = client.get("/openapi.json").json()
        assert {"/v1/search", "/v1/kbs", "/v1/kbs/{kb_id}/documents", "/v1/batches/{batch_id}"} <= set(
            spec["paths"]
        )
        assert client.get("/docs").status_code == 200


def test_texts_sent_as_json_without_a_name_do_not_replace_each_other(server: Server) -> None:
    """Each was `content.txt`: the second text replaced the first (updated, version 2)."""
    kb = f"kb-{uuid.uuid4().hex[:6]}"
    with server.client("a_admin") as client:
        assert client.post("/v1/kbs", json={"kb_id": kb, "name": kb}).status_code == 201
        sent = [
            client.post(f"/v1/kbs/{kb}/documents", json={"content": text}).json()["documents"][0]
            for text in ("The first note.", "The second note.", "The first note.")
        ]
        assert [d["outcome"] for d in sent] == ["created", "created", "unchanged"]
        assert sent[0]["doc_id"] != sent[1]["doc_id"]
        assert sent[2]["doc_id"] == sent[0]["doc_id"]
        named = client.post(f"/v1/kbs/{kb}/documents", json={"content": "Named.", "doc_id": "team/notes.md"})
        assert named.json()["documents"][0]["doc_id"] == "team/notes.md"
        client.delete(f"/v1/kbs/{kb}")

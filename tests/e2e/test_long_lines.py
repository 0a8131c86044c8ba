"""Documents with lines of megabytes, uploaded and searched as a user would.

The model's tokenizer reads a word of over 100 characters as one unknown token, so a chunk budget
in tokens alone let a CSV row of megabytes, or one long token, become a single chunk of that
size; OpenSearch then refused to highlight it, and every search that found it answered 503.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from shared.config import load_settings
from shared.embedding import token_counter
from shared.models import KbSettings
from tests.e2e.helpers import Server, call, http_session, start_server, stop_server, wait_ready
from workers.stages.chunk import body_budget, max_chars

pytestmark = [pytest.mark.e2e, pytest.mark.anyio]

MAX_FILE = 4 << 20
DOCUMENTS = {
    # One row of 2 MB between ordinary ones.
    "rows.csv": "station,reading\nkestrel ridge,7\n" + "x" * 2_000_000 + ",1\nheron marsh,3\n",
    # A 1.1 MB token among words.
    "token.txt": "Kestrel survey notes from the ridge. " * 3 + "y" * 1_100_000 + " Heron counts follow.",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    handle, process = start_server(
        tmp_path_factory.mktemp("long-lines-api"), {"RAGLINE_API__MAX_FILE_BYTES": str(MAX_FILE)}
    )
    yield handle
    stop_server(process)


@pytest.fixture(scope="module")
def kb(server: Server) -> str:
    kb_id = f"long-{uuid.uuid4().hex[:8]}"
    with server.client("a_admin") as api:
        created = api.post("/v1/kbs", json={"kb_id": kb_id, "name": kb_id, "settings": {"pii_policy": "off"}})
        assert created.status_code == 201, created.text
        for name, body in DOCUMENTS.items():
            sent = api.post(
                f"/v1/kbs/{kb_id}/documents",
                files=[("files", (name, body.encode(), "application/octet-stream"))],
            )
            assert sent.status_code == 202, sent.text
        docs = wait_ready(api, kb_id, list(DOCUMENTS), timeout_s=900)
    assert {d: v["status"] for d, v in docs.items()} == dict.fromkeys(DOCUMENTS, "ready"), docs
    return kb_id


def _longest_allowed() -> int:
    settings = load_settings()
    return max_chars(body_budget(KbSettings().chunk_size, token_counter(settings.embedding).max_seq_length))


def test_every_chunk_is_bounded_and_the_text_is_all_there(server: Server, kb: str) -> None:
    limit = _longest_allowed()
    with server.client("a_admin") as api:
        for name, (run, last_words) in {
            "rows.csv": ("x", "heron marsh"),
            "token.txt": ("y", "Heron counts"),
        }.items():
            doc = api.get(f"/v1/kbs/{kb}/documents/{name}").json()
            assert doc["chunk_count"] >= DOCUMENTS[name].count(run) // limit, doc
            texts = _all_texts(api, kb, name, doc["chunk_count"])
            assert max(len(t) for t in texts) <= limit
            joined = "".join(texts)
            assert joined.count(run) >= DOCUMENTS[name].count(run)  # overlaps may repeat a little
            assert last_words in joined


def _all_texts(api: httpx.Client, kb: str, doc_id: str, total: int) -> list[str]:
    """The document's chunk texts, read 41 at a time as an agent widening a hit would."""
    texts: dict[int, str] = {}
    for centre in range(20, total + 20, 41):
        page = api.get(f"/v1/kbs/{kb}/chunks", params={"doc_id": doc_id, "chunk_idx": centre, "window": 20})
        assert page.status_code == 200, page.text
        texts |= {c["chunk_idx"]: c["text"] for c in page.json()["chunks"]}
    assert sorted(texts) == list(range(total))
    return [texts[i] for i in range(total)]


@pytest.mark.parametrize("mode", ["hybrid", "keyword", "similarity"])
@pytest.mark.parametrize("doc_id", list(DOCUMENTS))
def test_searches_that_find_them_answer_over_rest(server: Server, kb: str, mode: str, doc_id: str) -> None:
    # One document at a time: hundreds of near-identical chunks of one run of letters may fill a
    # k-NN top 50 on their own, so an unfiltered similarity search need not reach the other file.
    with server.client("a_read") as api:
        found = api.post(
            "/v1/search",
            json={
                "query": "kestrel heron",
                "kb_ids": [kb],
                "top_k": 50,
                "mode": mode,
                "filters": {"doc_ids": [doc_id]},
            },
        )
    assert found.status_code == 200, found.text
    hits = found.json()["results"]
    assert {h["doc_id"] for h in hits} == {doc_id}
    assert max(len(h["text"]) for h in hits) <= _longest_allowed()


async def test_searches_that_find_them_answer_over_mcp(server: Server, kb: str) -> None:
    async with http_session(server, "a_read") as session:
        found = await call(session, "search", query="kestrel heron", kb_ids=[kb], top_k=50)
    assert {h["doc_id"] for h in found["results"]} == set(DOCUMENTS)

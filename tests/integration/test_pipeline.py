"""The ingestion pipeline on the real stack: every format to `ready`, versions, deletes, failures."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.embedding import embedded_text, encoder, token_counter
from shared.ingest import Ingestor
from shared.models import DocStatus, KnowledgeBase, Outcome
from shared.registry import KbCounts, Registry, doc_key
from shared.search.requests import SearchRequest
from shared.search.schema import chunks_alias, docs_index
from shared.search.searcher import Searcher
from tests.fixtures import samples
from tests.integration.helpers import chunks_of, new_kb, wait_terminal
from tests.integration.stored_vectors import chunk_filter, mean_direction, stored_cosine

pytestmark = pytest.mark.integration

PAGED = {"paper.pdf", "deck.pptx", "sheet.xlsx"}
STRUCTURED = {
    "notes.txt": "MAINTENANCE",
    "guide.md": "Installing",
    "page.html": "Billing",
    "report.docx": "Revenue",
}


@pytest.fixture(scope="module")
def corpus(registry: Registry, ingestor: Ingestor) -> tuple[KnowledgeBase, dict[str, Any]]:
    # PII off: the small spaCy model's false positives (e.g. "Glacier" as a PERSON) would hide
    # the phrases this test looks for; redaction has its own test below.
    kb = new_kb(registry, pii_policy="off")
    files = samples.every_type()
    for name, (data, _) in files.items():
        result = ingestor.submit(kb.tenant_id, kb.kb_id, data, filename=name)
        assert result.outcome == Outcome.CREATED
        # A worker may claim it before this read: the record's first transition says it was queued.
        recorded = registry.require_doc(kb.tenant_id, kb.kb_id, result.doc_id).doc
        assert recorded.transitions[0]["status"] == DocStatus.QUEUED
    docs = wait_terminal(registry, kb, list(files))
    return kb, {"files": files, "docs": docs}


def test_every_supported_type_reaches_ready(corpus: tuple[KnowledgeBase, dict[str, Any]]) -> None:
    _, data = corpus
    failed = {name: doc.error for name, doc in data["docs"].items() if doc.status != DocStatus.READY}
    assert failed == {}
    for name, doc in data["docs"].items():
        assert doc.progress == 1.0
        assert doc.chunk_count >= 1, name
        assert set(doc.timings) == {"parse", "chunk", "enrich", "pii", "embed", "store"}
        statuses = [t["status"] for t in doc.transitions]
        assert statuses == [
            "queued",
            "parsing",
            "chunking",
            "enriching",
            "redacting",
            "embedding",
            "indexing",
            "ready",
        ]


def test_light_stages_run_in_their_predecessors_task(
    corpus: tuple[KnowledgeBase, dict[str, Any]], opensearch: OpenSearch, settings: Settings
) -> None:
    """Each hop through the broker costs the registry a read and two writes; a chained stage's
    hand-over is also its claim, and into a light stage it is not written while the claim's
    lease has half a stage lease left: the next write records it. 13 writes a document when
    every stage is its own task, 6 now: the create, parse's claim, the hand-over to embed (with
    chunk, enrich and pii done), embed's claim, its hand-over to store, and ready. Lease
    renewals would add more (none in stages this short)."""
    kb, data = corpus
    for name in data["files"]:
        record = opensearch.get(index=docs_index(settings), id=doc_key(kb.tenant_id, kb.kb_id, name))
        assert record["_version"] <= 6, (name, record["_version"])


def test_chunks_carry_vectors_pages_and_headings(
    corpus: tuple[KnowledgeBase, dict[str, Any]], opensearch: OpenSearch, settings: Settings
) -> None:
    kb, data = corpus
    for name, (_, phrase) in data["files"].items():
        chunks = chunks_of(opensearch, settings, kb, name)
        assert len(chunks) == data["docs"][name].chunk_count
        # The vectors live in the vector files only: each is its chunk's text encoded by the model.
        assert not any("embedding" in c or "document_embedding" in c for c in chunks), name
        fresh = encoder(settings.embedding).encode([embedded_text(c) for c in chunks])
        for chunk, vector in zip(chunks, fresh, strict=True):
            where = chunk_filter(kb.tenant_id, kb.kb_id, chunk)
            cosine = stored_cosine(opensearch, chunks_alias(settings), "embedding", where, vector)
            assert (cosine or 0.0) > 0.999, (name, chunk["chunk_idx"], cosine)
        assert phrase.lower() in " ".join(c["text"] for c in chunks).lower(), name
        if name in PAGED:
            assert all(isinstance(c["page_num"], int) and c["page_num"] >= 1 for c in chunks), name
            assert all(c["page_label"] for c in chunks), name
        if name in STRUCTURED:
            holder = next(c for c in chunks if phrase.lower() in c["text"].lower())
            assert STRUCTURED[name] in holder["headings"], (name, holder["headings"])
            assert STRUCTURED[name] in holder["context"]
    pdf_pages = {c["page_num"] for c in chunks_of(opensearch, settings, kb, "paper.pdf")}
    assert pdf_pages == {1, 2}


def test_first_chunk_carries_the_whole_documents_text_and_mean_vector(
    corpus: tuple[KnowledgeBase, dict[str, Any]], opensearch: OpenSearch, settings: Settings
) -> None:
    kb, data = corpus
    for name in data["files"]:
        first, *rest = chunks_of(opensearch, settings, kb, name)
        assert first["document_text"] == "\n\n".join(c["text"] for c in [first, *rest]), name
        assert not any("document_text" in c for c in rest), name
        fresh = encoder(settings.embedding).encode([embedded_text(c) for c in [first, *rest]])
        mean = mean_direction(fresh)
        # The mean vector is on the first chunk and on no other: a document's vector lives once.
        cosines = {
            c["chunk_idx"]: stored_cosine(
                opensearch,
                chunks_alias(settings),
                "document_embedding",
                chunk_filter(kb.tenant_id, kb.kb_id, c),
                mean,
            )
            for c in [first, *rest]
        }
        assert [i for i, cosine in cosines.items() if cosine is not None] == [first["chunk_idx"]], name
        assert (cosines[first["chunk_idx"]] or 0.0) > 0.999, (name, cosines)


def test_no_chunk_exceeds_the_models_max_sequence_length(
    corpus: tuple[KnowledgeBase, dict[str, Any]], opensearch: OpenSearch, settings: Settings
) -> None:
    kb, _ = corpus
    counter = token_counter(settings.embedding)
    chunks = chunks_of(opensearch, settings, kb)
    embedded = [f"{c['context']}\n{c['text']}" for c in chunks]
    longest = max(n + 2 for n in counter.count(embedded))
    print(f"longest embedded chunk: {longest} tokens of {counter.max_seq_length}")
    assert longest <= counter.max_seq_length


def test_long_document_is_split_within_budget(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry, chunk_size=128, chunk_overlap=16)
    sections = [
        f"# Part {p}\n\n"
        + " ".join(f"Sentence {i} of part {p} talks about topic {i % 7}." for i in range(60))
        for p in range(3)
    ]
    ingestor.submit(kb.tenant_id, kb.kb_id, "\n\n".join(sections).encode(), filename="long.md")
    doc = wait_terminal(registry, kb, ["long.md"])["long.md"]
    assert doc.status == DocStatus.READY
    chunks = chunks_of(opensearch, settings, kb, "long.md")
    assert len(chunks) > 6
    counter = token_counter(settings.embedding)
    assert max(counter.count([f"{c['context']}\n{c['text']}" for c in chunks])) + 2 <= 128
    assert [c["chunk_idx"] for c in chunks] == list(range(len(chunks)))
    assert {h for c in chunks for h in c["headings"]} == {"Part 0", "Part 1", "Part 2"}
    # Offsets point into the parsed text, in document order.
    assert all(c["char_start"] < c["char_end"] for c in chunks)
    assert [c["char_start"] for c in chunks] == sorted(c["char_start"] for c in chunks)


def _search_text(
    opensearch: OpenSearch, settings: Settings, kb: KnowledgeBase, query: str
) -> list[dict[str, Any]]:
    opensearch.indices.refresh(index=chunks_alias(settings))
    body = {
        "query": {
            "bool": {"filter": [{"term": {"tenant_id": kb.tenant_id}}], "must": [{"match": {"text": query}}]}
        }
    }
    return [h["_source"] for h in opensearch.search(index=chunks_alias(settings), body=body)["hits"]["hits"]]


def test_json_is_titled_by_its_name_and_its_nested_keys_are_words(
    corpus: tuple[KnowledgeBase, dict[str, Any]], opensearch: OpenSearch, settings: Settings
) -> None:
    """A JSON file was titled after its first key, and `service.port` was one token: a keyword
    search for `port` missed it."""
    kb, _ = corpus
    chunks = chunks_of(opensearch, settings, kb, "config.json")
    assert {chunk["title"] for chunk in chunks} == {"config"}
    found = {hit["doc_id"] for hit in _search_text(opensearch, settings, kb, "port")}
    assert "config.json" in found
    assert any("port: 8443" in chunk["text"] for chunk in chunks)


def test_a_lone_surrogate_escape_in_json_reads_as_a_replacement_character(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    """JSON's escape "\\ud800" decodes to a code point no UTF-8 holds: every write of the parsed
    text failed, the parse stage ran again each time, and the document failed only when its
    retries ran out, with no error naming the cause."""
    kb = new_kb(registry)  # PII redacts: the analysis reads the text too
    data = b'{"name": "bad \\ud800 here", "note": "mail jane.doe@example.org", "t": "x\\udfff"}'
    ingestor.submit(kb.tenant_id, kb.kb_id, data, filename="surrogates.json")
    doc = wait_terminal(registry, kb, ["surrogates.json"])["surrogates.json"]
    assert doc.status == DocStatus.READY, doc.error
    assert doc.attempts == 1
    text = " ".join(chunk["text"] for chunk in chunks_of(opensearch, settings, kb, "surrogates.json"))
    assert "name: bad \ufffd here" in text
    assert "t: x\ufffd" in text
    assert "jane.doe@example.org" not in text


def test_same_bytes_are_unchanged_and_new_bytes_replace_the_old_version(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry)
    first = b"Version one talks about the albatross migration.\n"
    ingestor.submit(kb.tenant_id, kb.kb_id, first, filename="v.txt")
    ready = wait_terminal(registry, kb, ["v.txt"])["v.txt"]
    again = ingestor.submit(kb.tenant_id, kb.kb_id, first, filename="v.txt")
    assert again.outcome == Outcome.UNCHANGED
    after = registry.require_doc(kb.tenant_id, kb.kb_id, "v.txt").doc
    assert after.transitions == ready.transitions  # nothing was enqueued or re-run
    assert after.content_version == 1

    second = ("Version two is about the pelican colony instead. " * 40 + "\n\n") * 3
    updated = ingestor.submit(kb.tenant_id, kb.kb_id, second.encode(), filename="v.txt")
    assert updated.outcome == Outcome.UPDATED
    assert updated.content_version == 2
    doc = wait_terminal(registry, kb, ["v.txt"])["v.txt"]
    assert doc.status == DocStatus.READY
    assert doc.active_generation == 2
    # Readers see only the active generation from the moment the document is ready...
    searcher = Searcher(opensearch, settings)
    for mode in ("keyword", "similarity", "hybrid"):
        for query in ("albatross migration", "pelican colony"):
            request = SearchRequest(query=query, mode=mode, top_k=50)
            hits = searcher.search(kb.tenant_id, [kb.kb_id], request).results
            assert all("pelican" in h.text and "albatross" not in h.text for h in hits), (mode, query)
    keyword_old = SearchRequest(query="albatross", mode="keyword")
    assert searcher.search(kb.tenant_id, [kb.kb_id], keyword_old).results == []
    # ...and the old generation's chunks are deleted from the index right after.
    deadline = time.monotonic() + 30
    while {c["generation"] for c in chunks_of(opensearch, settings, kb, "v.txt")} != {2}:
        assert time.monotonic() < deadline, "the old generation was not retired"
        time.sleep(0.2)
    chunks = chunks_of(opensearch, settings, kb, "v.txt")
    assert len(chunks) == doc.chunk_count > 1
    assert _search_text(opensearch, settings, kb, "albatross") == []
    assert _search_text(opensearch, settings, kb, "pelican")


def test_delete_removes_every_chunk_from_bm25_and_knn(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry)
    ingestor.submit(
        kb.tenant_id, kb.kb_id, b"The okapi lives in the Ituri rainforest.\n", filename="okapi.txt"
    )
    assert wait_terminal(registry, kb, ["okapi.txt"])["okapi.txt"].status == DocStatus.READY
    vector = encoder(settings.embedding).encode(
        [embedded_text(chunks_of(opensearch, settings, kb, "okapi.txt")[0])]
    )[0]
    deleted = ingestor.delete(kb.tenant_id, kb.kb_id, "okapi.txt")
    assert deleted.status == DocStatus.DELETED
    assert _search_text(opensearch, settings, kb, "okapi rainforest") == []
    knn = {
        "knn": {
            "embedding": {"vector": vector.tolist(), "k": 10, "filter": {"term": {"tenant_id": kb.tenant_id}}}
        }
    }
    hits = opensearch.search(index=chunks_alias(settings), body={"query": knn})["hits"]["hits"]
    assert hits == []
    assert registry.require_doc(kb.tenant_id, kb.kb_id, "okapi.txt").doc.status == DocStatus.DELETED


BAD_FILES: dict[str, tuple[Callable[[], bytes], str]] = {
    "broken.pdf": (
        lambda: b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\ngarbage\x00\xff" * 3,
        "PARSE_ERROR",
    ),
    "empty.txt": (lambda: b"", "EMPTY_DOCUMENT"),
    "program.txt": (
        lambda: b"MZ\x90\x00\x03\x00\x00\x00\x04\x00\x00\x00\xff\xff" + bytes(range(256)) * 4,
        "UNSUPPORTED_MEDIA_TYPE",
    ),
}


def test_bad_files_fail_with_their_code_while_a_good_one_is_ready(
    registry: Registry, ingestor: Ingestor
) -> None:
    kb = new_kb(registry)
    for name, (make, _) in BAD_FILES.items():
        ingestor.submit(kb.tenant_id, kb.kb_id, make(), filename=name)
    ingestor.submit(
        kb.tenant_id, kb.kb_id, b"A perfectly good note about lighthouses.\n", filename="good.txt"
    )
    docs = wait_terminal(registry, kb, [*BAD_FILES, "good.txt"])
    assert docs["good.txt"].status == DocStatus.READY
    for name, (_, code) in BAD_FILES.items():
        doc = docs[name]
        assert doc.status == DocStatus.FAILED, name
        assert doc.error is not None
        assert (doc.error.code, doc.error.stage, doc.error.retryable) == (code, "parse", False), name
        assert doc.error.message
    # The knowledge base counts its documents by status: a count alone read as loaded while most
    # of them still waited. (The count is a search: it sees the records once refreshed.)
    expected = {"ready": 1, "failed": len(BAD_FILES)}
    deadline = time.monotonic() + 30
    counts = registry.kb_counts(kb.tenant_id, [kb.kb_id]).get(kb.kb_id, KbCounts())
    while counts.by_status != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        counts = registry.kb_counts(kb.tenant_id, [kb.kb_id]).get(kb.kb_id, KbCounts())
    assert (counts.documents, counts.by_status) == (1 + len(BAD_FILES), expected)


def test_scanned_pdf_pages_are_ocred(
    registry: Registry, ingestor: Ingestor, opensearch: OpenSearch, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    pdf = samples.scanned_pdf(["Maintenance Log", "The boiler pressure valve was replaced."])
    ingestor.submit(kb.tenant_id, kb.kb_id, pdf, filename="scan.pdf")
    doc = wait_terminal(registry, kb, ["scan.pdf"])["scan.pdf"]
    assert doc.status == DocStatus.READY, doc.error
    text = " ".join(c["text"] for c in chunks_of(opensearch, settings, kb, "scan.pdf")).lower()
    assert "boiler pressure valve" in text
    assert {c["page_num"] for c in chunks_of(opensearch, settings, kb, "scan.pdf")} == {1}


def test_many_small_documents_share_embedding_batches(
    registry: Registry, ingestor: Ingestor, settings: Settings
) -> None:
    kb = new_kb(registry, pii_policy="off")
    names = [f"memo-{i}.txt" for i in range(16)]
    # Straight to a queue, all at once: this tests the embed stage's batching itself. Bulk
    # admission through the fair lanes keeps fewer documents in flight (see docs/pipeline.md), and so does
    # the default interactive quota: this ingestor's quota holds them all.
    api = settings.api.model_copy(update={"interactive_max_in_flight": len(names)})
    roomy = Ingestor(
        settings.model_copy(update={"api": api}), registry, ingestor.blobs, ingestor.sender, ingestor.broker
    )
    for i, name in enumerate(names):
        roomy.submit(
            kb.tenant_id,
            kb.kb_id,
            f"Memo {i}: the shipment {i * 13} left the dock.\n".encode(),
            filename=name,
            priority="interactive",
        )
    docs = wait_terminal(registry, kb, names)
    assert all(doc.status == DocStatus.READY for doc in docs.values())
    batches = [doc.stats["embed"]["batch_documents"] for doc in docs.values()]
    stored = [doc.stats["store"]["batch_documents"] for doc in docs.values()]
    print(f"documents per embedding batch: {sorted(batches)}; per store (one refresh each): {sorted(stored)}")
    assert max(batches) > 1
    assert max(stored) > 1

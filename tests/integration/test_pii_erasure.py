"""No raw value stays anywhere: not in a status, an index or the blob store, and not after a delete.

Each test plants values new to this run (tests/fixtures/pii_canaries.py `fresh_canaries`), so a
search of every `<prefix>-*` index (tests/integration/pii_leaks.py) and of every file under the
blob store finds only what this test left. A fragment of the e-mail address (the random part of
its local name) is looked for as well: keywords computed before redaction held such fragments.
"""

from __future__ import annotations

import random
import time
from dataclasses import replace
from datetime import timedelta

import pytest
import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.blobs import BlobStore
from shared.catalog import Catalog
from shared.config import Settings
from shared.ingest import Ingestor
from shared.models import DocStatus, KnowledgeBase, utcnow
from shared.registry import Registry
from shared.wiring import Services
from tests.fixtures.pii_canaries import fresh_canaries
from tests.integration.helpers import chunks_of, new_kb, wait_terminal
from tests.integration.pii_leaks import blob_store_leaks, index_leaks
from workers.reconciler import reconcile_once

pytestmark = pytest.mark.integration


def _values() -> tuple[dict[str, str], list[str]]:
    """Fresh canaries, and everything to look for: each value and the e-mail's random fragment."""
    values = fresh_canaries(random.Random())
    fragment = values["EMAIL_ADDRESS"].split("@")[0].split(".")[1]
    return values, [*values.values(), fragment]


def _markdown(values: dict[str, str]) -> bytes:
    """A short report whose title and every paragraph hold personal data."""
    email = values["EMAIL_ADDRESS"]
    return "\n\n".join(
        [
            f"# Escalation for {email}",
            f"For the refund, write to {email} before Friday; cc: {email} and {email} again.",
            f"The customer can be reached by phone at {values['PHONE_NUMBER']} during office hours.",
            f"The payment was made with credit card number {values['CREDIT_CARD']} last week.",
            f"Please transfer the deposit to IBAN {values['IBAN_CODE']} by the end of the month.",
            f"The failed login came from IP address {values['IP_ADDRESS']} at midnight.",
            f"Her social security number is {values['US_SSN']} according to the form.",
        ]
    ).encode()


@pytest.fixture
def catalog(settings: Settings, registry: Registry, ingestor: Ingestor) -> Catalog:
    return Catalog(settings, registry, ingestor)


@pytest.fixture
def blobs(services: Services) -> BlobStore:
    return services.blobs


def _cache_entries(caches: redis.Redis, tenant_id: str) -> set[str]:
    """The tenant's entries in the caches derived from texts, and the lists naming them."""
    kinds = ("emb", "pii", "cached-by")
    return {
        key.decode() if isinstance(key, bytes) else key
        for kind in kinds
        for key in caches.scan_iter(match=f"ragline:{kind}:{tenant_id}:*", count=1000)
    }


def _cached_kinds(entries: set[str]) -> set[str]:
    return {entry.split(":")[1] for entry in entries}


def _status_leaks(catalog: Catalog, kb: KnowledgeBase, doc_id: str, wanted: list[str]) -> list[str]:
    status = catalog.document_status(kb.tenant_id, kb.kb_id, doc_id).model_dump_json()
    record = catalog.get_document(kb.tenant_id, kb.kb_id, doc_id)
    return [f"{value} (status)" for value in wanted if value in status or value in str(record)]


def test_a_blocked_documents_status_and_stored_stages_hold_no_raw_value(
    registry: Registry, ingestor: Ingestor, settings: Settings, catalog: Catalog
) -> None:
    values, wanted = _values()
    kb = new_kb(registry, pii_policy="block")
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(values), filename="escalation.md")
    doc = wait_terminal(registry, kb, ["escalation.md"])["escalation.md"]
    assert doc.status == DocStatus.FAILED
    assert doc.error is not None
    assert doc.error.code == "PII_BLOCKED"
    assert _status_leaks(catalog, kb, "escalation.md", wanted) == []
    # Only the uploaded bytes stay (a re-ingest reads them); no stage left its text behind.
    leaks = blob_store_leaks(settings, wanted)
    assert leaks
    assert [leak for leak in leaks if "(blobs/" not in leak] == []


def test_deletes_leave_no_byte_of_a_ready_a_blocked_or_a_superseded_version(
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    catalog: Catalog,
    blobs: BlobStore,
    redis_client: redis.Redis,
) -> None:
    kb = new_kb(registry)  # redact
    blocking = new_kb(registry, pii_policy="block")
    ready, ready_wanted = _values()
    first, first_wanted = _values()
    second, second_wanted = _values()
    blocked, blocked_wanted = _values()
    everything = ready_wanted + first_wanted + second_wanted + blocked_wanted

    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(ready), filename="ready.md")
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(first), filename="versions.md")
    ingestor.submit(blocking.tenant_id, blocking.kb_id, _markdown(blocked), filename="blocked.md")
    done = wait_terminal(registry, kb, ["ready.md", "versions.md"])
    assert {d: doc.status for d, doc in done.items()} == dict.fromkeys(done, DocStatus.READY)
    assert wait_terminal(registry, blocking, ["blocked.md"])["blocked.md"].status == DocStatus.FAILED
    first_hash = done["versions.md"].content_hash
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(second), filename="versions.md")
    updated = wait_terminal(registry, kb, ["versions.md"])["versions.md"]
    assert updated.status == DocStatus.READY
    assert updated.content_version == 2

    # While they live: the indexes and statuses hold only redacted text, the title included,
    # and the superseded version's bytes and stage artifacts are gone already.
    assert index_leaks(opensearch, settings, kb.tenant_id, everything) == []
    assert index_leaks(opensearch, settings, blocking.tenant_id, everything) == []
    titles = {catalog.document_status(kb.tenant_id, kb.kb_id, d).title for d in ("ready.md", "versions.md")}
    assert titles == {"Escalation for <EMAIL_ADDRESS>"}
    assert not blobs.exists(first_hash)
    assert blob_store_leaks(settings, first_wanted) == []

    # Their texts' vectors and PII findings are cached, each listed under the document version that
    # wrote it (both versions of versions.md); a blocked document was analyzed but never embedded.
    cached = _cache_entries(redis_client, kb.tenant_id)
    assert _cached_kinds(cached) == {"emb", "pii", "cached-by"}
    lists = {tuple(key.split(":")[4:]) for key in cached if key.startswith("ragline:cached-by:")}
    assert lists >= {("ready.md", "1"), ("versions.md", "1"), ("versions.md", "2")}
    assert _cached_kinds(_cache_entries(redis_client, blocking.tenant_id)) == {"pii", "cached-by"}

    for kb_of, doc_id in ((kb, "ready.md"), (kb, "versions.md"), (blocking, "blocked.md")):
        assert ingestor.delete(kb_of.tenant_id, kb_of.kb_id, doc_id).status == DocStatus.DELETED
    assert _cache_entries(redis_client, kb.tenant_id) == set()
    assert _cache_entries(redis_client, blocking.tenant_id) == set()
    leaks = blob_store_leaks(settings, everything)
    leaks += index_leaks(opensearch, settings, kb.tenant_id, everything)
    leaks += index_leaks(opensearch, settings, blocking.tenant_id, everything)
    print(f"canaries: {len(everything)} values of 4 versions; found after the deletes: {len(leaks)}")
    assert leaks == []
    assert chunks_of(opensearch, settings, kb) == []


def test_bytes_another_live_document_shares_stay_until_it_is_deleted(
    registry: Registry, ingestor: Ingestor, settings: Settings, blobs: BlobStore
) -> None:
    values, wanted = _values()
    data = _markdown(values)
    one, other = new_kb(registry), new_kb(registry)  # two tenants, one blob
    for kb in (one, other):
        ingestor.submit(kb.tenant_id, kb.kb_id, data, filename="shared.md")
    for kb in (one, other):
        assert wait_terminal(registry, kb, ["shared.md"])["shared.md"].status == DocStatus.READY
    sha = registry.require_doc(one.tenant_id, one.kb_id, "shared.md").doc.content_hash

    ingestor.delete(one.tenant_id, one.kb_id, "shared.md")
    assert blobs.exists(sha)  # the other tenant's document still needs it: a re-ingest reads it
    reingested = ingestor.reingest(other.tenant_id, other.kb_id, "shared.md")
    assert wait_terminal(registry, other, ["shared.md"])["shared.md"].status == DocStatus.READY
    assert reingested.content_version == 2

    ingestor.delete(other.tenant_id, other.kb_id, "shared.md")
    assert not blobs.exists(sha)
    assert blob_store_leaks(settings, wanted) == []


def test_an_interrupted_delete_is_finished_by_the_reconciler(
    services: Services,
    registry: Registry,
    ingestor: Ingestor,
    opensearch: OpenSearch,
    settings: Settings,
    sender: Celery,
    redis_client: redis.Redis,
    blobs: BlobStore,
) -> None:
    values, wanted = _values()
    kb = new_kb(registry)
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(values), filename="half.md")
    ready = wait_terminal(registry, kb, ["half.md"])["half.md"]
    assert ready.status == DocStatus.READY
    assert chunks_of(opensearch, settings, kb, "half.md")
    assert _cached_kinds(_cache_entries(redis_client, kb.tenant_id)) == {"emb", "pii", "cached-by"}
    # What a delete leaves when its process dies after its first write: the record `deleting`
    # under a newer version, chunks and bytes untouched; here its lease has run out as well.
    current = registry.require_doc(kb.tenant_id, kb.kb_id, "half.md")
    record = current.doc.model_copy(deep=True)
    record.content_version += 1
    record.status = DocStatus.DELETING
    record.lease_until = utcnow() - timedelta(seconds=1)
    registry.replace_doc(current, record)

    ctx = replace(services, blobs=blobs)
    reconcile_once(ctx)  # the worker's own reconciler may have been first: the same end

    doc = registry.require_doc(kb.tenant_id, kb.kb_id, "half.md").doc
    assert doc.status == DocStatus.DELETED
    assert doc.lease_until is None
    assert chunks_of(opensearch, settings, kb, "half.md") == []
    assert not blobs.exists(ready.content_hash)
    assert blob_store_leaks(settings, wanted) == []
    assert _cache_entries(redis_client, kb.tenant_id) == set()


def test_deleting_a_knowledge_base_removes_its_bytes_but_not_those_another_shares(
    registry: Registry,
    ingestor: Ingestor,
    settings: Settings,
    catalog: Catalog,
    blobs: BlobStore,
    redis_client: redis.Redis,
) -> None:
    own, own_wanted = _values()
    shared, shared_wanted = _values()
    kb, other = new_kb(registry), new_kb(registry)
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(own), filename="own.md")
    ingestor.submit(kb.tenant_id, kb.kb_id, _markdown(shared), filename="shared.md")
    ingestor.submit(other.tenant_id, other.kb_id, _markdown(shared), filename="shared.md")
    assert all(
        d.status == DocStatus.READY for d in wait_terminal(registry, kb, ["own.md", "shared.md"]).values()
    )
    assert wait_terminal(registry, other, ["shared.md"])["shared.md"].status == DocStatus.READY
    sha = registry.require_doc(other.tenant_id, other.kb_id, "shared.md").doc.content_hash
    assert _cached_kinds(_cache_entries(redis_client, kb.tenant_id)) == {"emb", "pii", "cached-by"}
    others = _cache_entries(redis_client, other.tenant_id)
    assert _cached_kinds(others) == {"emb", "pii", "cached-by"}

    catalog.delete_kb(kb.tenant_id, kb.kb_id)
    assert blob_store_leaks(settings, own_wanted) == []
    assert blobs.exists(sha)  # the other knowledge base's document still needs it
    assert _cache_entries(redis_client, kb.tenant_id) == set()
    assert _cache_entries(redis_client, other.tenant_id) == others  # another tenant's own
    ingestor.delete(other.tenant_id, other.kb_id, "shared.md")
    assert blob_store_leaks(settings, shared_wanted) == []


def _long_note(rng: random.Random, paragraphs: int) -> bytes:
    """Paragraphs of words no other test writes: every chunk's text, and so its vector, is new."""
    words = [f"{rng.getrandbits(40):x}" for _ in range(2000)]
    return "\n\n".join(" ".join(rng.choices(words, k=120)) for _ in range(paragraphs)).encode()


def test_a_delete_while_the_document_embeds_leaves_no_cache_entry_once_the_stage_stops(
    registry: Registry, ingestor: Ingestor, redis_client: redis.Redis, settings: Settings
) -> None:
    """The delete swept the caches while the stage went on embedding for the rest of its turn:
    what it cached after the sweep stayed, for the cache's 30 days."""
    kb = new_kb(registry, pii_policy="off")
    # Minutes of embedding here: the delete comes early in its first turn.
    ingestor.submit(kb.tenant_id, kb.kb_id, _long_note(random.Random(), 600), filename="long.md")
    deadline = time.monotonic() + 300
    while (doc := registry.require_doc(kb.tenant_id, kb.kb_id, "long.md").doc).status != DocStatus.EMBEDDING:
        assert doc.status not in (DocStatus.READY, DocStatus.FAILED), doc.status  # too short to catch
        assert time.monotonic() < deadline, doc.status
        time.sleep(0.2)
    assert ingestor.delete(kb.tenant_id, kb.kb_id, "long.md").status == DocStatus.DELETED
    deleted = time.monotonic()
    # The stage goes on to the end of its turn (RAGLINE_EMBEDDING__TURN_S), caching each slice it
    # embeds; then it finds its version deleted and sweeps that version's list. Before the turn
    # can have ended the entries may be gone for a moment (the delete's sweep), not for good.
    time.sleep(settings.embedding.turn_s)
    written = len(_cache_entries(redis_client, kb.tenant_id))
    while (left := _cache_entries(redis_client, kb.tenant_id)) and time.monotonic() < deleted + 300:
        time.sleep(1.0)
    time.sleep(5.0)  # and nothing comes back
    left |= _cache_entries(redis_client, kb.tenant_id)
    print(f"cache entries and lists a turn after the delete: {written}; once the stage stopped: {len(left)}")
    assert left == set()

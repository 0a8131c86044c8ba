"""The per-process objects every route uses, built once when the app starts."""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery
from opensearchpy import OpenSearch

from services.core.auth import KeyRing
from shared.blobs import BlobStore
from shared.catalog import Catalog
from shared.config import Settings
from shared.ingest import Ingestor
from shared.queue import broker_client, redis_client
from shared.registry import Registry
from shared.search.client import build_client
from shared.search.requests import SearchRequest, SearchResponse
from shared.search.schema import ensure_indexes
from shared.search.searcher import Searcher


@dataclass
class AppState:
    settings: Settings
    keys: KeyRing | None  # None for stdio MCP, whose identity comes from configuration
    client: OpenSearch
    redis: redis.Redis
    sender: Celery
    registry: Registry
    ingestor: Ingestor
    catalog: Catalog
    searcher: Searcher

    def search(self, tenant_id: str, request: SearchRequest) -> SearchResponse:
        """A search of the caller's KBs, as both fronts run it (in one worker thread: each hop
        from the event loop to a thread and back waits for a core under load)."""
        kb_ids = self.catalog.readable_kb_ids(tenant_id, request.kb_ids)
        return self.searcher.search(tenant_id, kb_ids, request)


def build_state(settings: Settings, *, http: bool = True) -> AppState:
    """Check the configuration (HTTP auth fails closed), then connect; OpenSearch may come up later."""
    keys = KeyRing(settings.auth, settings.tenant) if http else None
    client = build_client(settings.opensearch)
    registry = Registry(client, settings)
    sender = broker_client(settings)
    broker = redis_client(settings)
    ingestor = Ingestor(settings, registry, BlobStore(settings.state_dir / "blobstore"), sender, broker)
    return AppState(
        settings=settings,
        keys=keys,
        client=client,
        redis=broker,
        sender=sender,
        registry=registry,
        ingestor=ingestor,
        catalog=Catalog(settings, registry, ingestor),
        searcher=Searcher(client, settings),
    )


def prepare_indexes(state: AppState) -> None:
    ensure_indexes(state.client, state.settings)

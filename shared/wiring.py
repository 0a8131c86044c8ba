"""The one place that builds a process's services from its settings: the API and the MCP fronts,
the worker, the integration tests and the bench all call `build_services`.

Building connects nothing: OpenSearch, Redis and the broker are reached at their first use, so a
front can start while a backing service is still coming up.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.blob_dir import DirBlobStore
from shared.blob_s3 import S3BlobStore
from shared.blobs import BlobStore
from shared.catalog import Catalog
from shared.config import Settings
from shared.ingest import Ingestor
from shared.queue import broker_client, redis_client
from shared.registry import Registry
from shared.search.client import build_client
from shared.search.schema import ensure_indexes
from shared.search.searcher import Searcher
from shared.sources.service import Sources
from shared.sources.store import SourceStore
from shared.stage_metrics import StageTimes


@dataclass(frozen=True)
class Services:
    settings: Settings
    client: OpenSearch
    redis: redis.Redis
    sender: Celery
    registry: Registry
    blobs: BlobStore
    ingestor: Ingestor
    catalog: Catalog
    searcher: Searcher
    source_store: SourceStore
    sources: Sources
    stage_times: StageTimes  # a worker's stage observations, until it writes them

    def prepare_indexes(self) -> None:
        """Create the indexes, templates and aliases that are missing (idempotent)."""
        ensure_indexes(self.client, self.settings)
        self.source_store.ensure_indexes()


def blob_store(settings: Settings, broker: redis.Redis) -> BlobStore:
    """The one choice of blob store: the bucket of `blobs.url`, else the state dir's directory.
    The S3 store locks its stripes in Redis, which every process sharing it reaches."""
    if settings.blobs.url is None:
        return DirBlobStore(settings.state_dir / "blobstore")
    return S3BlobStore(settings.blobs, broker, settings.state_dir / "blob-scratch")


def build_services(settings: Settings) -> Services:
    client = build_client(settings.opensearch)
    registry = Registry(client, settings)
    sender = broker_client(settings)
    broker = redis_client(settings)
    blobs = blob_store(settings, broker)
    source_store = SourceStore(client, settings)
    ingestor = Ingestor(settings, registry, blobs, sender, broker, source_store.exists)
    return Services(
        settings=settings,
        client=client,
        redis=broker,
        sender=sender,
        registry=registry,
        blobs=blobs,
        ingestor=ingestor,
        catalog=Catalog(settings, registry, ingestor),
        searcher=Searcher(client, settings),
        source_store=source_store,
        sources=Sources(settings, source_store, registry, broker),
        stage_times=StageTimes(),
    )

"""Fixtures that reach the real local stack. A missing service fails the test; nothing skips."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.blobs import BlobStore
from shared.config import Settings
from shared.ingest import Ingestor
from shared.queue import broker_client
from shared.registry import Registry
from shared.search.client import build_client
from shared.search.schema import ensure_indexes

START_HINT = "start the local stack with `make up` (or run `make test`, which starts it)"


@pytest.fixture(scope="session")
def opensearch(settings: Settings) -> OpenSearch:
    client = build_client(settings.opensearch)
    try:
        client.cluster.health(wait_for_status="yellow")
    except Exception as error:  # noqa: BLE001  (whatever the failure, the service is unusable)
        pytest.fail(f"OpenSearch at {settings.opensearch.url} is not reachable ({error}); {START_HINT}")
    return client


@pytest.fixture(scope="session")
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis.url, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(f"Redis at {settings.redis.url} is not reachable ({error}); {START_HINT}")
    yield client
    client.close()


@pytest.fixture(scope="session")
def sender(settings: Settings, redis_client: redis.Redis) -> Celery:
    return broker_client(settings)


@pytest.fixture(scope="session")
def registry(opensearch: OpenSearch, settings: Settings) -> Registry:
    ensure_indexes(opensearch, settings)
    return Registry(opensearch, settings)


@pytest.fixture(scope="session")
def ingestor(settings: Settings, registry: Registry, sender: Celery, redis_client: redis.Redis) -> Ingestor:
    return Ingestor(settings, registry, BlobStore(settings.state_dir / "blobstore"), sender, redis_client)

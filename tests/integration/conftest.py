"""Fixtures that reach the real local stack. A missing service fails the test; nothing skips."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import Ingestor
from shared.registry import Registry
from shared.sources.store import SourceStore
from shared.wiring import Services, build_services

START_HINT = "start the local stack with `make up` (or run `make test`, which starts it)"


@pytest.fixture(scope="session")
def services(settings: Settings) -> Services:
    """The services a worker or a front builds, wired by the same function; fails when the stack
    is not up. A test that needs other parts swaps them in with `dataclasses.replace`."""
    built = build_services(settings)
    try:
        built.client.cluster.health(wait_for_status="yellow")
    except Exception as error:  # noqa: BLE001  (whatever the failure, the service is unusable)
        pytest.fail(f"OpenSearch at {settings.opensearch.url} is not reachable ({error}); {START_HINT}")
    try:
        built.redis.ping()
    except redis.RedisError as error:
        pytest.fail(f"Redis at {settings.redis.url} is not reachable ({error}); {START_HINT}")
    built.prepare_indexes()
    return built


@pytest.fixture(scope="session")
def opensearch(services: Services) -> OpenSearch:
    return services.client


@pytest.fixture(scope="session")
def redis_client(services: Services) -> redis.Redis:
    return services.redis


@pytest.fixture(scope="session")
def sender(services: Services) -> Celery:
    return services.sender


@pytest.fixture(scope="session")
def registry(services: Services) -> Registry:
    return services.registry


@pytest.fixture(scope="session")
def ingestor(services: Services) -> Ingestor:
    return services.ingestor


@pytest.fixture
def own_source_store(opensearch: OpenSearch, settings: Settings) -> Iterator[SourceStore]:
    """A sources store in indexes of the test's own (another prefix): the stack's runners never
    see its records."""
    prefix = f"ragline-test-{uuid.uuid4().hex[:8]}"
    own = settings.model_copy(
        update={"opensearch": settings.opensearch.model_copy(update={"index_prefix": prefix})}
    )
    sources = SourceStore(opensearch, own)
    sources.ensure_indexes()
    try:
        yield sources
    finally:
        opensearch.indices.delete(index=f"{prefix}-*")

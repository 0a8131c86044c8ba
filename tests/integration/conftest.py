"""Fixtures that reach the real local stack. A missing service fails the test; nothing skips."""

from __future__ import annotations

import pytest
import redis
from celery import Celery
from opensearchpy import OpenSearch

from shared.config import Settings
from shared.ingest import Ingestor
from shared.registry import Registry
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

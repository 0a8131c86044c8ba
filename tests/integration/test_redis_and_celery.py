"""The Redis the project started persists, and a real worker process executes tasks sent through it."""

from __future__ import annotations

import os
import uuid

import pytest
import redis
from celery import Celery

from shared.config import Settings
from shared.queue import enqueue, ping_workers

pytestmark = pytest.mark.integration


def test_redis_round_trip_with_append_only_persistence(redis_client: redis.Redis) -> None:
    key = f"ragline-test:{uuid.uuid4().hex}"
    redis_client.set(key, "value", ex=60)
    assert redis_client.get(key) == b"value"
    redis_client.delete(key)
    assert redis_client.config_get("appendonly") == {"appendonly": "yes"}


@pytest.mark.parametrize("queue", ["interactive", "bulk"])
def test_a_real_worker_executes_a_task_from_each_queue(
    sender: Celery, settings: Settings, queue: str
) -> None:
    payload = uuid.uuid4().hex
    result = enqueue(sender, settings, "ragline.ping", args=(payload,), queue=queue)
    answer = result.get(timeout=60)
    assert answer["payload"] == payload
    # Executed by another process (the worker), not in this test process.
    assert answer["pid"] != os.getpid()
    workers = ping_workers(sender, timeout_s=2.0)
    assert workers, "no worker answered a control ping"

"""The worker's Celery configuration has its reliability settings (docs/architecture.md#pipeline-stages)."""

from __future__ import annotations

from shared.config import load_settings
from workers.celery_app import celery_config


def test_reliability_settings() -> None:
    settings = load_settings(
        celery={"visibility_timeout_s": 7200, "time_limit_s": 900, "soft_time_limit_s": 800}
    )
    config = celery_config(settings)
    assert config["task_acks_late"] is True
    assert config["task_reject_on_worker_lost"] is True
    assert config["worker_prefetch_multiplier"] == 1
    assert config["broker_transport_options"]["visibility_timeout"] == 7200
    assert (
        config["broker_transport_options"]["queue_order_strategy"] == "workers.queue_cycle:InteractiveFirst"
    )
    assert config["task_time_limit"] == 900
    assert config["task_soft_time_limit"] == 800
    assert config["accept_content"] == ["json"]
    # Pool processes load their models before reporting up: Celery's 4 s default killed them.
    assert config["worker_proc_alive_timeout"] >= 60
    assert [queue.name for queue in config["task_queues"]] == ["interactive", "bulk"]


def test_broker_comes_from_settings() -> None:
    settings = load_settings(redis={"url": "redis://127.0.0.1:6390/3"})
    assert celery_config(settings)["broker_url"] == "redis://127.0.0.1:6390/3"

"""Stage routing to specialised workers, and the OpenSearch node list of a cluster."""

from __future__ import annotations

import os

import pytest

from shared.config import ConfigError, load_settings
from shared.models import PIPELINE, Stage
from shared.queue import all_queues, lane_queues, stage_queue
from workers.celery_app import celery_config

SPLIT = {"embed": "{queue}-embed", "store": "{queue}-embed"}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RAGLINE_"):
            monkeypatch.delenv(name)


def test_by_default_every_stage_stays_on_the_documents_queue() -> None:
    settings = load_settings()
    assert {
        stage_queue(settings, queue, stage) for queue in ("interactive", "bulk") for stage in PIPELINE
    } == {
        "interactive",
        "bulk",
    }
    assert all_queues(settings) == ["interactive", "bulk"]
    assert [queue.name for queue in celery_config(settings)["task_queues"]] == ["interactive", "bulk"]


def test_routed_stages_get_a_queue_per_document_queue() -> None:
    settings = load_settings(celery={"stage_queues": SPLIT})
    assert stage_queue(settings, "bulk", Stage.PARSE) == "bulk"
    assert stage_queue(settings, "bulk", Stage.PII) == "bulk"
    assert stage_queue(settings, "bulk", Stage.EMBED) == "bulk-embed"
    assert stage_queue(settings, "interactive", Stage.STORE) == "interactive-embed"
    assert lane_queues(settings, "bulk") == ["bulk", "bulk-embed"]
    # Interactive work, every stage of it, still comes before bulk work.
    assert all_queues(settings) == ["interactive", "interactive-embed", "bulk", "bulk-embed"]
    assert [queue.name for queue in celery_config(settings)["task_queues"]] == all_queues(settings)


def test_a_fixed_stage_queue_is_shared_by_every_document_queue() -> None:
    settings = load_settings(celery={"stage_queues": {"parse": "parsing"}})
    assert (
        stage_queue(settings, "interactive", Stage.PARSE)
        == stage_queue(settings, "bulk", "parse")
        == "parsing"
    )
    assert all_queues(settings) == ["interactive", "parsing", "bulk"]


def test_stage_queues_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_CELERY__STAGE_QUEUES", '{"embed": "{queue}-embed"}')
    assert load_settings().celery.stage_queues == {Stage.EMBED: "{queue}-embed"}


@pytest.mark.parametrize(
    ("stage_queues", "expected"),
    [
        ({"embedding": "x"}, "RAGLINE_CELERY__STAGE_QUEUES"),
        ({"embed": "has space"}, "is not a queue name"),
        ({"embed": ""}, "is not a queue name"),
    ],
)
def test_bad_stage_queues_are_refused(stage_queues: dict[str, str], expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(celery={"stage_queues": stage_queues})
    assert expected in str(caught.value)


def test_one_url_is_one_node() -> None:
    settings = load_settings(opensearch={"url": "http://127.0.0.1:9200/"})
    assert settings.opensearch.url == "http://127.0.0.1:9200"
    assert settings.opensearch.urls == ["http://127.0.0.1:9200"]


def test_a_cluster_is_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_OPENSEARCH__URL", "http://127.0.0.1:9200, http://127.0.0.1:9201/")
    settings = load_settings()
    assert settings.opensearch.urls == ["http://127.0.0.1:9200", "http://127.0.0.1:9201"]


def test_every_node_url_is_checked() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(opensearch={"url": "http://127.0.0.1:9200,127.0.0.1:9201"})
    assert "RAGLINE_OPENSEARCH__URL" in str(caught.value)

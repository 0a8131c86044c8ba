"""Settings: sources, precedence and the messages a bad value produces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shared.config import ConfigError, load_settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RAGLINE_"):
            monkeypatch.delenv(name)


def test_defaults_point_at_the_local_stack() -> None:
    settings = load_settings()
    assert settings.opensearch.url == "http://127.0.0.1:9200"
    assert settings.redis.url == "redis://127.0.0.1:6379/0"
    assert settings.embedding.dimension == 384
    assert settings.celery.queues == ["interactive", "bulk"]


def test_nested_environment_variables_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_OPENSEARCH__URL", "https://search.example:9201/")
    monkeypatch.setenv("RAGLINE_CELERY__WORKER_CONCURRENCY", "3")
    monkeypatch.setenv("RAGLINE_CELERY__QUEUES", '["interactive"]')
    settings = load_settings()
    assert settings.opensearch.url == "https://search.example:9201"
    assert settings.celery.worker_concurrency == 3
    assert settings.celery.queues == ["interactive"]


def test_yaml_file_is_read_and_environment_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "ragline.yaml"
    config.write_text(
        "log_level: DEBUG\nredis:\n  url: redis://10.0.0.5:6380/1\nopensearch:\n  replicas: 2\n"
    )
    monkeypatch.setenv("RAGLINE_CONFIG", str(config))
    monkeypatch.setenv("RAGLINE_OPENSEARCH__REPLICAS", "1")
    settings = load_settings()
    assert settings.log_level == "DEBUG"
    assert settings.redis.url == "redis://10.0.0.5:6380/1"
    assert settings.opensearch.replicas == 1


def test_bad_values_name_the_setting_and_what_is_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGLINE_LOG_LEVEL", "LOUD")
    monkeypatch.setenv("RAGLINE_OPENSEARCH__URL", "ftp://nowhere")
    monkeypatch.setenv("RAGLINE_CELERY__WORKER_CONCURRENCY", "0")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert "RAGLINE_LOG_LEVEL: Input should be 'DEBUG', 'INFO', 'WARNING' or 'ERROR' (got 'LOUD')" in message
    assert "RAGLINE_OPENSEARCH__URL" in message
    assert "http:// or https://" in message
    assert "RAGLINE_CELERY__WORKER_CONCURRENCY: Input should be greater than or equal to 1" in message


def test_unknown_yaml_key_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "ragline.yaml"
    config.write_text("opensearch:\n  urll: http://typo:9200\n")
    monkeypatch.setenv("RAGLINE_CONFIG", str(config))
    with pytest.raises(ConfigError, match="RAGLINE_OPENSEARCH__URLL: Extra inputs are not permitted"):
        load_settings()


def test_missing_config_file_is_an_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAGLINE_CONFIG", str(tmp_path / "absent.yaml"))
    with pytest.raises(ConfigError, match="RAGLINE_CONFIG: no such file"):
        load_settings()


def test_visibility_timeout_must_outlast_the_hard_time_limit() -> None:
    with pytest.raises(ConfigError, match=r"visibility_timeout_s .* must be greater than time_limit_s"):
        load_settings(celery={"visibility_timeout_s": 600, "time_limit_s": 900, "soft_time_limit_s": 800})


def test_a_parse_must_time_out_before_its_task_is_interrupted() -> None:
    with pytest.raises(ConfigError, match=r"parse.timeout_s \(590\) must be more than 30 s below"):
        load_settings(parse={"timeout_s": 590})
    assert load_settings(parse={"timeout_s": 500}).parse.timeout_s == 500


def test_hard_time_limit_must_exceed_soft() -> None:
    with pytest.raises(ConfigError, match="RAGLINE_CELERY__TIME_LIMIT_S: Value error, must be greater than"):
        load_settings(celery={"soft_time_limit_s": 100, "time_limit_s": 100})

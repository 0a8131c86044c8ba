"""Every Redis client a request or a worker job uses gives up on a Redis that stops answering."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest
import redis

from services.core.container import build_state
from shared.config import Settings
from shared.queue import redis_client


@pytest.fixture
def silent_redis() -> Iterator[str]:
    """A TCP server on loopback that accepts connections and never answers: a stalled Redis."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"
    stop.set()
    thread.join()
    for connection in held:
        connection.close()
    server.close()


def _settings(url: str) -> Settings:
    return Settings.model_validate(
        {"redis": {"url": url, "timeout_s": 0.5}, "auth": {"allow_anonymous": True}}
    )


def test_the_shared_client_gives_up_on_a_silent_redis(silent_redis: str) -> None:
    client = redis_client(_settings(silent_redis))
    with pytest.raises(redis.TimeoutError):
        client.ping()


def test_the_api_state_uses_the_bounded_client(silent_redis: str) -> None:
    state = build_state(_settings(silent_redis))
    assert state.redis.connection_pool.connection_kwargs["socket_timeout"] == 0.5
    with pytest.raises(redis.TimeoutError):
        state.redis.llen("ragline:any")
    assert state.ingestor.broker is state.redis

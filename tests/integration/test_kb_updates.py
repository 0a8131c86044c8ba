"""Knowledge-base updates are optimistic, and a reembed takes only a model the server knows.

Real OpenSearch. A race is staged, not hoped for: the registry's client lets one write (the end
of a reembed) land between a KB update's read and its write.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from opensearchpy import OpenSearch

from shared.blob_dir import DirBlobStore
from shared.catalog import Catalog, KbChanges
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.ingest import Ingestor
from shared.models import KnowledgeBase, Reembed
from shared.queue import broker_client
from shared.registry import Registry
from shared.wiring import Services
from tests.integration.helpers import new_kb
from workers.reembed import reembed

pytestmark = pytest.mark.integration

QUIET_DB = 13  # no worker serves it: a reembed task sent there would stay, countable
MPNET = ("all-mpnet-base-v2", 768)


class Interleaved:
    """The real client; the first write to the KB index is preceded by another writer's write."""

    def __init__(self, client: OpenSearch, kbs_index: str, other_write: Callable[[], object]) -> None:
        self._client, self._kbs, self._other_write = client, kbs_index, other_write
        self.fired = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def index(self, **kwargs: Any) -> Any:
        if kwargs.get("index") == self._kbs and not self.fired:
            self.fired = True
            self._other_write()
        return self._client.index(**kwargs)


def _reembedding(registry: Registry) -> KnowledgeBase:
    kb = new_kb(registry)
    return registry.save_kb(kb.model_copy(update={"reembed": Reembed(model=MPNET[0])}))


def _reembed_ends(registry: Registry, kb: KnowledgeBase) -> Callable[[], object]:
    """The write the reembed's end makes (as the worker wrote it before KB writes were optimistic)."""

    def write() -> object:
        record = registry.get_kb(kb.tenant_id, kb.kb_id)
        done = record.model_copy(
            update={"embedding_model": MPNET[0], "embedding_dimension": MPNET[1], "reembed": None}
        )
        return registry.save_kb(done)

    return write


def test_a_kb_change_racing_the_end_of_a_reembed_keeps_both(
    opensearch: OpenSearch, registry: Registry, settings: Settings, ingestor: Ingestor
) -> None:
    kb = _reembedding(registry)
    racing = Interleaved(opensearch, registry.kbs, _reembed_ends(registry, kb))
    catalog = Catalog(settings, Registry(cast(OpenSearch, racing), settings), ingestor)
    view = catalog.update_kb(kb.tenant_id, kb.kb_id, KbChanges(description="Field notes", tags=["botany"]))
    stored = registry.get_kb(kb.tenant_id, kb.kb_id)
    assert racing.fired
    assert (stored.description, stored.tags) == ("Field notes", ["botany"])
    assert (stored.embedding_model, stored.embedding_dimension, stored.reembed) == (*MPNET, None)
    assert view.embedding_model == MPNET[0]


def test_a_model_change_during_a_reembed_is_a_conflict(registry: Registry) -> None:
    kb = _reembedding(registry)

    def swap_model(record: KnowledgeBase) -> KnowledgeBase:
        return record.model_copy(update={"embedding_model": MPNET[0], "embedding_dimension": MPNET[1]})

    with pytest.raises(RaglineError) as refused:
        registry.update_kb(kb.tenant_id, kb.kb_id, swap_model)
    assert refused.value.code == ErrorCode.CONFLICT
    assert registry.get_kb(kb.tenant_id, kb.kb_id).embedding_model == kb.embedding_model


@pytest.fixture
def quiet(settings: Settings) -> Iterator[tuple[Settings, redis.Redis]]:
    url = settings.redis.url.rsplit("/", 1)[0] + f"/{QUIET_DB}"
    quiet_settings = settings.model_copy(update={"redis": settings.redis.model_copy(update={"url": url})})
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield quiet_settings, client
    client.flushdb()
    client.close()


def _model_dir(tmp_path: Path) -> Path:
    """A directory that looks like a model (what the old check accepted)."""
    directory = tmp_path / "not-a-model"
    directory.mkdir()
    (directory / "tokenizer.json").write_text("{}")
    return directory


def test_a_reembed_to_a_server_path_is_refused_and_sends_nothing(
    registry: Registry, quiet: tuple[Settings, redis.Redis], tmp_path: Path
) -> None:
    quiet_settings, client = quiet
    ingestor = Ingestor(
        quiet_settings, registry, DirBlobStore(tmp_path / "blobs"), broker_client(quiet_settings), client
    )
    catalog = Catalog(quiet_settings, registry, ingestor)
    kb = new_kb(registry)
    directory = _model_dir(tmp_path)
    for model in (str(directory), "../../../tmp", "no-such-model"):
        with pytest.raises(RaglineError) as refused:
            catalog.start_reembed(kb.tenant_id, kb.kb_id, model)
        assert refused.value.code == ErrorCode.INVALID_ARGUMENT
        assert model not in refused.value.message
    assert registry.get_kb(kb.tenant_id, kb.kb_id).reembed is None
    assert client.llen("bulk") == 0
    assert sorted(p.name for p in directory.iterdir()) == ["tokenizer.json"]


def test_a_reembed_task_naming_an_unknown_model_writes_nothing(
    services: Services, registry: Registry, quiet: tuple[Settings, redis.Redis], tmp_path: Path
) -> None:
    """A task the API would not have sent (an old record, a forged message): refused in the worker."""
    quiet_settings, client = quiet
    directory = _model_dir(tmp_path)
    kb = new_kb(registry)
    registry.save_kb(kb.model_copy(update={"reembed": Reembed(model=str(directory))}))
    ctx = replace(
        services,
        settings=quiet_settings,
        blobs=DirBlobStore(tmp_path / "blobs"),
        sender=broker_client(quiet_settings),
        redis=client,
    )
    with pytest.raises(Exception, match="not one this server knows"):
        reembed(ctx, kb.tenant_id, kb.kb_id, str(directory))
    stored = registry.get_kb(kb.tenant_id, kb.kb_id)
    assert stored.reembed is None
    assert stored.reembed_error is not None
    assert stored.reembed_error.startswith("ModelUnavailable")
    assert stored.embedding_model == kb.embedding_model
    assert sorted(p.name for p in directory.iterdir()) == ["tokenizer.json"]

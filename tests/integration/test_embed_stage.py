"""The embed stage against a real Redis cache: a document with a chunk over the model's input
length fails alone, and the documents batched with it are encoded and cached."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from shared.embedding import embedded_text, encoder
from shared.errors import ErrorCode, RaglineError
from shared.models import PIPELINE, Document, Stage, utcnow
from shared.wiring import Services
from workers import lifecycle
from workers.stages import embed
from workers.stages.base import TurnEnded, TurnTally


def _doc(name: str, tenant: str = "t") -> Document:
    return Document(tenant_id=tenant, kb_id="k", doc_id=name, content_hash="0" * 64, file_size=1)


def _chunks(*texts: str) -> dict[str, Any]:
    return {
        "chunks": [
            {"chunk_idx": i, "text": t, "headings": [], "context": "A page"} for i, t in enumerate(texts)
        ]
    }


def test_a_chunk_over_the_models_length_fails_only_its_own_document(services: Services) -> None:
    fresh = uuid.uuid4().hex  # texts no earlier run cached
    model = services.settings.embedding.model
    items = [
        (_doc("before.txt"), _chunks(f"first {fresh}", f"second {fresh}")),
        (_doc("long.txt"), _chunks(f"fine {fresh}", " ".join(["word"] * 400) + fresh)),
        (_doc("after.txt"), _chunks(f"third {fresh}")),
        (_doc("longer.txt"), _chunks(" ".join(["word"] * 600) + fresh)),
    ]
    results = embed._run_model_batch(services, model, items)

    refused, longer = results[1], results[3]
    assert isinstance(refused, RaglineError)
    assert isinstance(longer, RaglineError)
    assert refused.code == longer.code == ErrorCode.INTERNAL
    assert "over the model's" in refused.message
    assert refused.message != longer.message  # each names its own chunk's tokens
    for (_, cleaned), result in ((items[0], results[0]), (items[2], results[2])):
        assert not isinstance(result, RaglineError)
        assert all(chunk["embedding_b64"] for chunk in result.artifact["chunks"])
        assert result.updates["stats"]["embed"]["embedded"] == len(cleaned["chunks"])
    keys = [embed.cache_key("t", model, embedded_text(c)) for c in items[1][1]["chunks"]]
    assert services.redis.mget(keys) == [None, None]  # nothing of the refused document is cached
    assert len(results) == len(items)


def test_one_tenants_cache_tells_another_nothing(services: Services) -> None:
    """A count of cached chunks is in every document's status: a cache shared across tenants
    would confirm to one tenant the exact text another stored."""
    secret = f"The quarterly number is 7. {uuid.uuid4().hex}"
    model = services.settings.embedding.model
    stored = embed._run_model_batch(services, model, [(_doc("alice.txt", "alice"), _chunks(secret))])
    for tenant, expected in (("bob", {"embedded": 1, "cached": 0}), ("alice", {"embedded": 0, "cached": 1})):
        guessed = embed._run_model_batch(services, model, [(_doc("guess.txt", tenant), _chunks(secret))])[0]
        assert not isinstance(guessed, RaglineError)
        stats = guessed.updates["stats"]["embed"]
        assert {k: stats[k] for k in expected} == expected, tenant
    assert not isinstance(stored[0], RaglineError)


def test_a_large_document_keeps_what_it_embedded_before_its_time_ran_out(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors are cached slice by slice: a retry after the task's time limit goes on from there."""
    fresh = uuid.uuid4().hex
    model = services.settings.embedding.model
    texts = [f"passage {n} of a long manual {fresh}" for n in range(embed.ENCODE_SLICE + 10)]
    real = encoder(services.settings.embedding)
    calls: list[int] = []

    class OutOfTime(Exception):
        pass

    class RunsOutAfterOneSlice:
        dimension, max_seq_length = real.dimension, real.max_seq_length

        def encode(self, batch: list[str], *, whole: bool = False) -> Any:
            calls.append(len(batch))
            if len(calls) > 1:
                raise OutOfTime  # as Celery's soft time limit interrupts the task
            return real.encode(batch, whole=whole)

    monkeypatch.setattr(embed, "encoder", lambda settings: RunsOutAfterOneSlice())
    doc = _doc("manual.txt")
    with pytest.raises(OutOfTime):
        embed._run_model_batch(services, model, [(doc, _chunks(*texts))])
    assert calls == [embed.ENCODE_SLICE, 10]  # out of time in the second slice
    monkeypatch.undo()
    retried = embed._run_model_batch(services, model, [(doc, _chunks(*texts))])[0]
    assert not isinstance(retried, RaglineError)
    assert retried.updates["stats"]["embed"] == {
        "embedded": 10,
        "cached": embed.ENCODE_SLICE,
        "batch_documents": 1,
    }


def test_an_embedding_whose_turn_ran_out_keeps_what_it_embedded(services: Services) -> None:
    """A turn ends after a slice, never before one: each turn gets on, and the next goes on from
    there, every text encoded once."""
    fresh = uuid.uuid4().hex
    model = services.settings.embedding.model
    texts = [f"paragraph {n} of a long log {fresh}" for n in range(embed.ENCODE_SLICE + 10)]
    doc = _doc("log.txt")
    doc.progress = PIPELINE.index(Stage.EMBED) / len(PIPELINE)
    with pytest.raises(TurnEnded) as turn:
        embed._run_model_batch(services, model, [(doc, _chunks(*texts))], turn_ends=0.0)
    assert (turn.value.done, turn.value.total) == (embed.ENCODE_SLICE, len(texts))
    tally = turn.value.tallies[("t", "k", "log.txt")]
    assert tally == TurnTally(embed.ENCODE_SLICE, len(texts), embed.ENCODE_SLICE)
    # What the runner writes between the turns: progress moved, and what the turn encoded.
    released = lifecycle.release_turn(doc, utcnow(), Stage.EMBED, tally)
    assert doc.progress < released.progress < (PIPELINE.index(Stage.EMBED) + 1) / len(PIPELINE)
    finished = embed._run_model_batch(services, model, [(released, _chunks(*texts))], turn_ends=0.0)[0]
    assert not isinstance(finished, RaglineError)  # the last slice ends it, turn or no turn
    # Every text was encoded here, over two turns: the second found the first's in the cache,
    # and said 10 embedded, 256 cached.
    assert finished.updates["stats"] == {
        "embed": {"embedded": len(texts), "cached": 0, "batch_documents": 1, "turns": 2}
    }
    assert all(chunk["embedding_b64"] for chunk in finished.artifact["chunks"])

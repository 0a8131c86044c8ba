"""The embed stage against a real Redis cache: a document with a chunk over the model's input
length fails alone, and the documents batched with it are encoded and cached."""

from __future__ import annotations

import uuid
from typing import Any

from shared.embedding import embedded_text
from shared.errors import ErrorCode, RaglineError
from shared.models import Document
from shared.wiring import Services
from workers.stages import embed


def _doc(name: str) -> Document:
    return Document(tenant_id="t", kb_id="k", doc_id=name, content_hash="0" * 64, file_size=1)


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
    keys = [embed.cache_key(model, embedded_text(c)) for c in items[1][1]["chunks"]]
    assert services.redis.mget(keys) == [None, None]  # nothing of the refused document is cached
    assert len(results) == len(items)

"""embed: one normalized vector per chunk, for "header\\ntext", with a cache keyed by that exact text.

The cache (Redis) means unchanged chunks of an edited document, or a re-ingest after a failure,
are never encoded twice. Vectors travel to the store stage as base64 float32.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import numpy as np

from shared.embedding import encoder
from shared.errors import ErrorCode, PermanentError
from shared.models import Document
from workers.context import WorkerContext
from workers.runner import StageResult

CACHE_TTL_S = 30 * 24 * 3600


def embedded_text(chunk: dict[str, Any]) -> str:
    header = chunk.get("context") or ""
    return f"{header}\n{chunk['text']}" if header else chunk["text"]


def cache_key(model: str, text: str) -> str:
    return f"ragline:emb:{model}:{hashlib.sha256(text.encode()).hexdigest()}"


def encode_b64(vector: np.ndarray[Any, Any]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def decode_b64(value: str) -> list[float]:
    values: list[float] = np.frombuffer(base64.b64decode(value), dtype="<f4").astype(float).tolist()
    return values


def run(ctx: WorkerContext, doc: Document, cleaned: dict[str, Any]) -> StageResult:
    settings = ctx.settings.embedding
    model = encoder(settings)
    chunks: list[dict[str, Any]] = cleaned["chunks"]
    texts = [embedded_text(c) for c in chunks]
    counts = model.count_tokens(texts)
    too_long = [i for i, n in enumerate(counts) if n > model.max_seq_length]
    if too_long:
        # The chunker's budget makes this impossible; refusing beats silently truncating.
        raise PermanentError(
            f"chunk {too_long[0]} exceeds the model's {model.max_seq_length} tokens", code=ErrorCode.INTERNAL
        )
    keys = [cache_key(settings.model, t) for t in texts]
    cached = ctx.redis.mget(keys) if keys else []
    vectors: list[str | None] = [c.decode() if isinstance(c, bytes) else c for c in cached]
    missing = [i for i, v in enumerate(vectors) if v is None]
    if missing:
        fresh = model.encode([texts[i] for i in missing])
        pipe = ctx.redis.pipeline(transaction=False)
        for i, vector in zip(missing, fresh, strict=True):
            encoded = encode_b64(vector)
            vectors[i] = encoded
            pipe.set(keys[i], encoded, ex=CACHE_TTL_S)
        pipe.execute()
    for chunk, vector in zip(chunks, vectors, strict=True):
        chunk["embedding_b64"] = vector
    stats = {"embedded": len(missing), "cached": len(chunks) - len(missing)}
    return StageResult(artifact={**cleaned, "embedding_stats": stats})

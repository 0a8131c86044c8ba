"""Query vectors for searches, from the model of the chunks searched, with a small LRU cache."""

from __future__ import annotations

import threading
from collections import OrderedDict

from shared.config import Settings
from shared.embedding import encoder, for_model


class QueryEmbedder:
    """Query vectors from the chunks' model, with a small LRU cache (agents repeat queries)."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings.embedding
        self._size = settings.search.query_cache_size
        self._cache: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, query: str, model: str | None = None) -> list[float]:
        key = (model or self._settings.model, query)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        model_settings = for_model(self._settings, key[0])
        vector = [float(x) for x in encoder(model_settings).encode([query])[0]]
        with self._lock:
            self._cache[key] = vector
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return vector

"""Loads the heavy resources of a pool process once, right after the worker forks it."""

from __future__ import annotations

import logging
import time

from shared.embedding import encoder
from workers.context import worker_context
from workers.stages import parse, pii

log = logging.getLogger(__name__)


def warm_up() -> None:
    started = time.perf_counter()
    try:
        # First, while this process is still small: every parse sandbox is forked from it.
        parse.start_fork_server()
        ctx = worker_context()
        model = encoder(ctx.settings.embedding)
        # The largest batch the model will see: its buffers reach their working size now, so
        # the worker's memory is flat from the first document on.
        model.encode(["warm up " * model.max_seq_length] * ctx.settings.embedding.batch_size)
        pii.analyzer().analyze(text="Warm up, Alice.", language="en")
    except Exception:
        log.warning("warm-up incomplete; resources will load on first use", exc_info=True)
        return
    log.info("pool process warmed up in %.1f s", time.perf_counter() - started)

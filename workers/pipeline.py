"""The pipeline order: which module runs each stage. Adding a stage touches this and its module."""

from __future__ import annotations

from typing import Any

from shared.errors import RaglineError
from shared.models import Document, Stage
from workers.context import WorkerContext
from workers.stages import chunk, embed, enrich, fetch, parse, pii, store
from workers.stages.base import BATCHED_STAGES, BatchFn, StageFn, StageResult, Stages


def _single(batch: BatchFn) -> StageFn:
    def run(ctx: WorkerContext, doc: Document, item: Any) -> StageResult:
        result = batch(ctx, [(doc, item)])[0]
        if isinstance(result, RaglineError):
            raise result
        return result

    return run


# Embedding batches documents together: many small documents must not mean batches of one; and
# the documents of an embedding batch are stored together, with one refresh.
BATCH_FUNCTIONS: dict[Stage, BatchFn] = {Stage.EMBED: embed.run_batch, Stage.STORE: store.run_batch}
assert set(BATCH_FUNCTIONS) == BATCHED_STAGES, "the runner announces arrivals at exactly these stages"

STAGE_FUNCTIONS: dict[Stage, StageFn] = {
    Stage.FETCH: fetch.run,
    Stage.PARSE: parse.run,
    Stage.CHUNK: chunk.run,
    Stage.ENRICH: enrich.run,
    Stage.PII: pii.run,
    Stage.EMBED: _single(embed.run_batch),
    Stage.STORE: _single(store.run_batch),
}

# Stages the task of the stage before runs itself when both go to the same queue (see runner.py):
# a hop through the broker cost a registry read, two writes and a broker round trip, and on
# manbench's man pages (10 chunks a page) the four light stages are each shorter than their hop.
# Never embed: its batch is made of the documents that wait for it in the queue.
CHAINED = frozenset({Stage.CHUNK, Stage.ENRICH, Stage.PII, Stage.STORE})
assert Stage.EMBED not in CHAINED

STAGES = Stages(functions=STAGE_FUNCTIONS, batches=BATCH_FUNCTIONS, chained=CHAINED)

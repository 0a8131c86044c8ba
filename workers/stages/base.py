"""What a stage is, as the runner sees it: its typed result and the shapes of its functions.

Every module under workers/stages/ imports this, never the runner that orchestrates it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from shared.errors import RaglineError
from shared.models import Document, Stage

if TYPE_CHECKING:
    from workers.context import WorkerContext

# Stages that run several documents at once: the runner announces arrivals at exactly these.
BATCHED_STAGES = frozenset({Stage.EMBED, Stage.STORE})


@dataclass
class StageResult:
    """What a stage produced: the artifact for the next stage and registry fields to set."""

    artifact: Any
    updates: dict[str, Any] = field(default_factory=dict)
    # Runs only after the registry recorded this result (e.g. retiring an old generation).
    after: Callable[[], None] | None = None
    # Runs instead when the record is gone by the time this result is written (its knowledge base
    # was deleted meanwhile): what the stage wrote outside the registry goes too, or it would
    # outlive the KB and show in a new KB of the same id (e.g. the chunks just stored).
    undo: Callable[[], None] | None = None
    # No later stage has anything to do: the document is ready now (a URL fetched again brought
    # the bytes of its ready version).
    finished: bool = False
    # The blob (sha256) the record names from this result on: held against removal until the
    # record is written, as an upload's bytes are (shared/blobs.py `pinned`).
    pin: str | None = None


# The stats entry of a stage between its turns: {"version", "count" (turns ended), "embedded"}.
TURNS = "turns"


@dataclass(frozen=True)
class TurnTally:
    """Where one document's stage stands when its turn ends: `done` of its `total` texts have their
    vectors, `encoded` of them encoded in this turn (the rest came from the cache)."""

    done: int
    total: int
    encoded: int


class TurnEnded(Exception):  # an outcome, not an error: nothing failed
    """Raised by a stage whose turn (`embedding.turn_s`) ran out with work left: what it did is kept
    (the embedding cache), and the runner releases its documents and sends the stage again to the
    back of its queue, so that another tenant's waiting documents get the process meanwhile.
    `tallies`: each document's, by (tenant_id, kb_id, doc_id)."""

    def __init__(
        self, done: int, total: int, tallies: dict[tuple[str, str, str], TurnTally] | None = None
    ) -> None:
        super().__init__(f"{done} of {total} done")
        self.done, self.total = done, total
        self.tallies = tallies or {}


# A stage's input is what the stage before handed on (parse: the path of the document's bytes).
StageInput = Any
StageFn = Callable[["WorkerContext", Document, StageInput], StageResult]
# A stage that can run several documents at once; one result (or error) per document, in order.
BatchFn = Callable[["WorkerContext", list[tuple[Document, StageInput]]], list[StageResult | RaglineError]]


@dataclass(frozen=True)
class Stages:
    """What the runner runs: each stage's function, the batched stages' batch functions, and the
    stages a task runs straight after the stage before them (a batched one among them runs the
    documents handed on together as its batch)."""

    functions: Mapping[Stage, StageFn]
    batches: Mapping[Stage, BatchFn]
    chained: frozenset[Stage]

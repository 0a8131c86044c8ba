"""Peer batching: documents waiting at a batched stage, announced in Redis, taken along by one task.

A document handed to a batched stage (`BATCHED_STAGES`) is announced in a Redis set; the task
of whichever document reaches the stage first takes up to `PEER_DOCS` others along, so many
small documents still make full model batches. Redis is read at once, unlike the registry's
search side; a lost announcement only means a smaller batch, since every document's own task
still comes (and finds its document moved on).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import RedisError

from shared import tracing
from shared.ingest import StageRef
from shared.models import Stage
from shared.registry import Versioned

PEER_DOCS = 31  # documents taken along by a batched stage, besides its own


def waiting_key(stage: Stage) -> str:
    return f"ragline:waiting:{stage.value}"


def announce(client: redis.Redis, ref: StageRef) -> None:
    """Say that `ref`'s document waits at its (batched) stage, with its trace context."""
    with contextlib.suppress(RedisError):  # only an optimisation: the document's own task still runs
        client.sadd(waiting_key(ref.stage), json.dumps({**ref.as_kwargs(), **tracing.carrier()}))


def claim_waiting(
    client: redis.Redis,
    ref: StageRef,
    claim: Callable[[StageRef], Versioned | None],
    traces: dict[StageRef, dict[str, str]],
) -> list[tuple[StageRef, Versioned]]:
    """Claim (with `claim`) other documents waiting at `ref`'s stage, up to `PEER_DOCS`.

    Each announcement carries its document's trace context, kept in `traces`, so a peer's next
    stage stays in its own trace.
    """
    peers = []
    popped = client.spop(waiting_key(ref.stage), PEER_DOCS)
    announced: list[bytes] = popped if isinstance(popped, list) else []
    for raw in announced:
        fields = json.loads(raw)
        trace = {name: fields.pop(name) for name in tracing.HEADERS if name in fields}
        peer_ref = StageRef(**{**fields, "stage": ref.stage})
        traces[peer_ref] = trace
        if (peer_ref.tenant_id, peer_ref.kb_id, peer_ref.doc_id) == (ref.tenant_id, ref.kb_id, ref.doc_id):
            continue
        peer = claim(peer_ref)
        if peer is not None:
            peers.append((peer_ref, peer))
    return peers


def peer_span(
    traces: dict[StageRef, dict[str, str]], ref: StageRef
) -> contextlib.AbstractContextManager[Any]:
    """The span of a peer's share of a batched stage, in the peer's own trace (none for the task's own)."""
    if not traces.get(ref):
        return contextlib.nullcontext()
    return tracing.span(f"stage {ref.stage.value}", traces[ref], doc_id=ref.doc_id, stage=ref.stage.value)

"""Peer batching: documents waiting at a batched stage, announced in Redis, taken along by one task.

A document handed to a batched stage (`BATCHED_STAGES`) is announced in a Redis set with its
chunk count; the task of whichever document reaches the stage first takes up to `PEER_DOCS`
others along, so many small documents still make full model batches. Redis is read at once,
unlike the registry's search side; a lost announcement only means a smaller batch, since every
document's own task still comes (and finds its document moved on).

A batch holds at most `PEER_CHUNKS` chunks, its own document's included: every document in it
waits for the whole batch, so one tenant's document of thousands of chunks must not take other
tenants' small ones along (they waited minutes behind it). A document at or over the bound takes
no peers, and a waiting one that would take the batch over it is left announced for another task
or its own.
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
PEER_CHUNKS = 512  # chunks of a batch with peers, its own document's included
CHUNKS = "chunk_count"  # the announcement's field beside the StageRef's and the trace's


def waiting_key(stage: Stage) -> str:
    return f"ragline:waiting:{stage.value}"


def announce(client: redis.Redis, ref: StageRef, chunk_count: int) -> None:
    """Say that `ref`'s document of `chunk_count` chunks waits at its (batched) stage, with its
    trace context. One of `PEER_CHUNKS` or more is not announced: no batch could take it along."""
    if chunk_count >= PEER_CHUNKS:
        return
    fields = {**ref.as_kwargs(), CHUNKS: chunk_count, **tracing.carrier()}
    with contextlib.suppress(RedisError):  # only an optimisation: the document's own task still runs
        client.sadd(waiting_key(ref.stage), json.dumps(fields))


def claim_waiting(
    client: redis.Redis,
    ref: StageRef,
    own_chunks: int,
    claim: Callable[[StageRef], Versioned | None],
    waits: Callable[[StageRef], bool],
    traces: dict[StageRef, dict[str, str]],
) -> list[tuple[StageRef, Versioned]]:
    """Claim (with `claim`) other documents waiting at `ref`'s stage, up to `PEER_DOCS` of them
    and `PEER_CHUNKS` chunks with the task's own `own_chunks`.

    One that would take the batch over the bound is put back only while it still `waits` there:
    else it could stay for good, each task that pops it putting it back.
    Each announcement carries its document's trace context, kept in `traces`, so a peer's next
    stage stays in its own trace.
    """
    if own_chunks >= PEER_CHUNKS:
        return []
    peers, chunks, left = [], own_chunks, []
    popped = client.spop(waiting_key(ref.stage), PEER_DOCS)
    announced: list[bytes] = popped if isinstance(popped, list) else []
    for raw in announced:
        fields = json.loads(raw)
        trace = {name: fields.pop(name) for name in tracing.HEADERS if name in fields}
        peer_chunks = int(fields.pop(CHUNKS, 0))
        peer_ref = StageRef(**{**fields, "stage": ref.stage})
        if (peer_ref.tenant_id, peer_ref.kb_id, peer_ref.doc_id) == (ref.tenant_id, ref.kb_id, ref.doc_id):
            continue
        if chunks + peer_chunks > PEER_CHUNKS:
            if waits(peer_ref):
                left.append(raw)
            continue
        traces[peer_ref] = trace
        peer = claim(peer_ref)
        if peer is not None:
            peers.append((peer_ref, peer))
            chunks += peer_chunks
    if left:
        with contextlib.suppress(RedisError):  # as a lost announcement: its own task still runs
            client.sadd(waiting_key(ref.stage), *left)
    return peers


def peer_span(
    traces: dict[StageRef, dict[str, str]], ref: StageRef
) -> contextlib.AbstractContextManager[Any]:
    """The span of a peer's share of a batched stage, in the peer's own trace (none for the task's own)."""
    if not traces.get(ref):
        return contextlib.nullcontext()
    return tracing.span(f"stage {ref.stage.value}", traces[ref], doc_id=ref.doc_id, stage=ref.stage.value)

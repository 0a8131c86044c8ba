"""The reconciler: nothing accepted is lost when a worker dies or the broker forgets its queues.

One worker process at a time (a Redis lease elects it) scans the registry every few seconds for
documents in a non-terminal state whose lease expired (a worker died mid-stage, or a send never
reached the broker) and sends their current stage again (a bulk document's first stage through its
fair lane, at its head if a worker had taken it already, and not at all while it still waits
there). If the broker lost its data (flushed, or restarted without persistence), which the
missing epoch key reveals, every unfinished document is sent again at once. Duplicate sends are
harmless: stage tasks are fenced.
A worker that stopped beating (workers/liveness.py) takes its reserved tasks with it, so its
death also sends every unfinished document again. A document is never failed for waiting;
after too many starts of one stage the claim logic fails it with RETRIES_EXHAUSTED.
A delete that stopped half way (its process died) leaves the record `deleting`, its lease run
out: the reconciler finishes it (shared/erasure.py), chunks, artifacts and bytes.
"""

from __future__ import annotations

import logging
from typing import Any

from shared import fairqueue
from shared.erasure import finish_delete
from shared.ingest import QUEUE_LEASE, STAGE_TASK, StageRef
from shared.models import ENTRY_STAGES, DocStatus, Document, Stage, utcnow
from shared.queue import enqueue, stage_queue
from shared.registry import Conflict, Versioned
from workers import liveness
from workers.context import WorkerContext

log = logging.getLogger(__name__)

EPOCH_KEY = "ragline:broker:epoch"
ACTIVE = [s.value for s in DocStatus if not s.terminal and s != DocStatus.DELETING]
PAGE = 500
ORDER = [{"tenant_id": "asc"}, {"kb_id": "asc"}, {"doc_id": "asc"}]


def resend_stuck(ctx: WorkerContext, found: Versioned) -> bool:
    """Send the document's stage again; a bulk document's first stage goes back through its lane.

    A bulk document still waiting its turn in the lane is not sent (that would jump the fair
    queue); only its lease is renewed. Returns whether anything was sent.
    """
    doc = found.doc
    stage = doc.stage or Stage.PARSE
    through_lane = doc.queue == fairqueue.BULK_QUEUE and stage in ENTRY_STAGES
    waiting = through_lane and fairqueue.is_waiting(
        ctx.redis, doc.tenant_id, doc.kb_id, doc.doc_id, doc.content_version
    )
    if not waiting:
        doc.claimed_by = None
    doc.lease_until = utcnow() + QUEUE_LEASE
    try:
        ctx.registry.replace_doc(found, doc)  # one reconciler wins per lease period
    except Conflict:
        return False
    if waiting:
        return False
    ref = StageRef(doc.tenant_id, doc.kb_id, doc.doc_id, doc.content_version, stage)
    if through_lane:
        started = doc.status != DocStatus.QUEUED  # it had its turn: a worker took it, then died
        kwargs = ref.as_kwargs()
        fairqueue.push(
            ctx.redis, doc.tenant_id, doc.kb_id, STAGE_TASK, kwargs, headers=doc.trace, front=started
        )
        return True
    queue = stage_queue(ctx.settings, doc.queue, stage)
    enqueue(ctx.sender, ctx.settings, STAGE_TASK, kwargs=ref.as_kwargs(), headers=doc.trace, queue=queue)
    return True


def _why(broker_lost: bool, dead: list[str]) -> str:
    if broker_lost:
        return " (broker data was lost)"
    return f" (workers died: {', '.join(dead)})" if dead else ""


def finish_deletes(ctx: WorkerContext) -> int:
    """Finish every delete whose lease ran out (its process died half way); returns how many."""
    expired = [
        {"term": {"status": DocStatus.DELETING.value}},
        {"range": {"lease_until": {"lt": utcnow().isoformat()}}},
    ]
    finished = 0
    for hit in ctx.registry.search_docs({"bool": {"filter": expired}}, size=PAGE, sort=ORDER):
        found = Versioned(Document.model_validate(hit["_source"]), hit["_seq_no"], hit["_primary_term"])
        found.doc.lease_until = utcnow() + QUEUE_LEASE
        try:
            claimed = ctx.registry.replace_doc(found, found.doc)  # one reconciler finishes each
        except Conflict:
            continue
        try:
            finish_delete(ctx.settings, ctx.registry, ctx.client, ctx.blobs, ctx.redis, claimed)
        except Exception as error:  # noqa: BLE001  (one delete never stops the resends; its lease brings it back)
            log.warning(
                "reconciler: finishing the delete of %s/%s failed (%s)",
                claimed.doc.kb_id,
                claimed.doc.doc_id,
                type(error).__name__,
            )
            continue
        finished += 1
    if finished:
        log.warning("reconciler: finished %d interrupted deletes", finished)
    return finished


def reconcile_once(ctx: WorkerContext) -> int:
    """Send again every unfinished document whose lease expired (all of them if the broker lost its
    data), and finish interrupted deletes; returns how many documents were sent."""
    broker_lost = bool(ctx.redis.set(EPOCH_KEY, utcnow().isoformat(), nx=True))
    dead = liveness.forget_dead(ctx.redis, ctx.settings.celery.worker_silent_s)
    filters: list[dict[str, Any]] = [{"terms": {"status": ACTIVE}}]
    if not (broker_lost or dead):
        filters.append({"range": {"lease_until": {"lt": utcnow().isoformat()}}})
    ctx.registry.refresh_docs()
    finish_deletes(ctx)  # more than a page of them waits for the next round
    sent = 0
    after: list[Any] | None = None
    while True:
        hits = ctx.registry.search_docs(
            {"bool": {"filter": filters}},
            size=PAGE,
            sort=ORDER,
            search_after=after,
        )
        for hit in hits:
            found = Versioned(Document.model_validate(hit["_source"]), hit["_seq_no"], hit["_primary_term"])
            sent += resend_stuck(ctx, found)
        if len(hits) < PAGE:
            break
        after = hits[-1]["sort"]
    if sent:
        log.warning(
            "reconciler: sent %d unfinished documents again%s",
            sent,
            _why(broker_lost, dead),
        )
    return sent

"""Admission: which queue a request's documents take, and when a tenant must wait (429).

The one policy every path into the pipeline meets (REST JSON and multipart, MCP, the CLI, re-ingest),
through `Ingestor`; fronts only say what the caller asked for. It follows what shared job systems do
for a latency class beside a throughput class (Kubernetes' API priority and fairness, per-tenant
concurrency quotas of hosted queues): the fast class is reserved for small units and bounded per
tenant, and everything else is fair-queued per tenant behind a bounded backlog.

- `interactive` (the queue workers serve first) takes one small document at a time: a single
  document of at most `api.interactive_max_bytes`, while the tenant has fewer than
  `api.interactive_max_in_flight` interactive documents unfinished. Asking for it is a wish, not a
  right: a document that does not qualify, or comes over the quota, goes to the tenant's fair lane,
  so an agent's burst is accepted and still cannot starve other tenants. Its size is judged again
  once chunked (`queue_after_chunking`): one that makes more than `api.interactive_max_chunks`
  chunks (a 1 MB CSV of 50,000 columns made 3,255, minutes of embedding) goes on in the bulk
  queue, so one large document does not hold the lane every tenant's agents wait on.
- `bulk` waits in the tenant's fair lane (shared/fairqueue.py); a request is refused with
  RATE_LIMITED while the tenant's waiting documents and the request's would pass
  `api.max_queued_tasks` (a request larger than the bound is taken only when nothing waits).

The interactive quota is counted in a Redis sorted set per tenant: a request reserves a slot
atomically before any byte is stored, the slot then names the document version it admitted, and
slots expire on their own. A slot is freed when its document is finished, which admission checks in
the registry only when the tenant is at its quota, so no worker has to report back and a lost
report cannot leak a slot.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta

import redis

from shared import fairqueue
from shared.config import Settings
from shared.errors import ErrorCode, RaglineError
from shared.models import DocStatus
from shared.registry import Registry

INTERACTIVE_QUEUE = "interactive"
PRIORITIES = (INTERACTIVE_QUEUE, fairqueue.BULK_QUEUE)
RESERVATION_S = 300.0  # a reserved slot not yet naming its document frees itself after this
SLOT_S = timedelta(minutes=30).total_seconds()  # a document holds its slot at most this long

# Free expired slots; take one if the tenant is under its quota (atomic: concurrent requests count).
_RESERVE = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""


def may_be_interactive(settings: Settings, priority: str | None, sizes: list[int | None]) -> bool:
    """Whether a request may take an interactive slot, before the tenant's quota is counted: one
    document of a known size within the bound, not opted out, on a deployment that serves the queue.

    `priority` None (the caller did not say) is the same wish as `interactive`: every front leaves
    the choice to this policy unless its caller opts out with `bulk`.
    """
    if priority is not None and priority not in PRIORITIES:
        raise RaglineError(
            f"priority must be one of {list(PRIORITIES)}",
            code=ErrorCode.INVALID_ARGUMENT,
            details={"field": "priority"},
        )
    api = settings.api
    return (
        priority != fairqueue.BULK_QUEUE
        and len(sizes) == 1
        and sizes[0] is not None
        and sizes[0] <= api.interactive_max_bytes
        and INTERACTIVE_QUEUE in settings.celery.queues
        and api.interactive_max_in_flight > 0
    )


def queue_after_chunking(settings: Settings, queue: str, chunks: int) -> str:
    """The queue of a document's stages after chunking: bulk for an interactive one of too many chunks."""
    if queue == INTERACTIVE_QUEUE and chunks > settings.api.interactive_max_chunks:
        return fairqueue.BULK_QUEUE
    return queue


def slots_key(tenant_id: str) -> str:
    return f"ragline:interactive:{tenant_id}"


@dataclass(frozen=True)
class Admission:
    """Where a request's documents go; `slot` is the interactive slot reserved for its one document."""

    queue: str
    slot: str | None = None


class Admitter:
    """Decides each request's queue and enforces the per-tenant bounds."""

    def __init__(self, settings: Settings, registry: Registry, broker: redis.Redis) -> None:
        self.settings = settings
        self.registry = registry
        self.broker = broker

    def admit(self, tenant_id: str, priority: str | None, sizes: list[int | None]) -> Admission:
        """The queue for a request of documents of these sizes (None: not known before reading)."""
        if may_be_interactive(self.settings, priority, sizes):
            slot = self._reserve(tenant_id)
            if slot is not None:
                return Admission(INTERACTIVE_QUEUE, slot)
        self._admit_bulk(tenant_id, len(sizes))
        return Admission(fairqueue.BULK_QUEUE)

    def hold(self, admission: Admission, tenant_id: str, kb_id: str, doc_id: str, version: int) -> None:
        """The reserved slot now belongs to this document version until it is finished."""
        if admission.slot is None:
            return
        pipe = self.broker.pipeline(transaction=True)
        pipe.zrem(slots_key(tenant_id), admission.slot)
        pipe.zadd(slots_key(tenant_id), {_slot_name(kb_id, doc_id, version): time.time() + SLOT_S})
        pipe.expire(slots_key(tenant_id), int(SLOT_S))
        pipe.execute()

    def release(self, admission: Admission, tenant_id: str) -> None:
        """Give back a reserved slot that admitted nothing (the request failed, or changed nothing)."""
        if admission.slot is not None:
            self.broker.zrem(slots_key(tenant_id), admission.slot)

    def interactive_in_flight(self, tenant_id: str) -> int:
        """Slots the tenant holds now (reservations and unfinished documents, expired ones aside)."""
        return int(self.broker.zcount(slots_key(tenant_id), time.time(), "+inf"))

    def _reserve(self, tenant_id: str) -> str | None:
        """A new slot, or None at the quota (after freeing the slots of finished documents)."""
        key, quota = slots_key(tenant_id), self.settings.api.interactive_max_in_flight
        reserve = self.broker.register_script(_RESERVE)
        token = f"reserved:{uuid.uuid4().hex}"
        for attempt in range(2):
            now = time.time()
            if reserve(keys=[key], args=[now, quota, token, now + RESERVATION_S, int(SLOT_S)]):
                return token
            if attempt == 0 and not self._free_finished(tenant_id):
                return None
        return None

    def _free_finished(self, tenant_id: str) -> int:
        """Drop the slots whose document is finished, superseded or gone; returns how many."""
        key = slots_key(tenant_id)
        held = [m.decode() for m in self.broker.zrange(key, 0, -1)]  # type: ignore[union-attr]
        named = {m: json.loads(m) for m in held if m.startswith("[")}
        if not named:
            return 0
        found = self.registry.doc_fields(
            tenant_id, [(kb, doc) for kb, doc, _ in named.values()], ["status", "content_version", "queue"]
        )
        done = []
        for (name, (_, _, version)), record in zip(named.items(), found, strict=True):
            if (
                record is None
                or record["content_version"] != version
                or record.get("queue") != INTERACTIVE_QUEUE
                or DocStatus(record["status"]).terminal
                or record["status"] == DocStatus.DELETING.value
            ):
                done.append(name)
        if done:
            self.broker.zrem(key, *done)
        return len(done)

    def _admit_bulk(self, tenant_id: str, documents: int) -> None:
        """Backpressure per tenant: refuse its bulk work while too much of it waits (nothing is dropped)."""
        waiting = fairqueue.pending(self.broker, tenant_id)
        bound = self.settings.api.max_queued_tasks
        if waiting > 0 and waiting + documents > bound:
            retry = self.settings.api.retry_after_s
            raise RaglineError(
                f"{waiting} of your documents are waiting (bound {bound}); retry in {retry} s",
                code=ErrorCode.RATE_LIMITED,
                details={"retry_after": retry, "queued": waiting},
            )


def _slot_name(kb_id: str, doc_id: str, version: int) -> str:
    return json.dumps([kb_id, doc_id, version])

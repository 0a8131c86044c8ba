"""Fair admission of bulk work: one lane per (tenant, kb), served round-robin into the bulk queue.

Bulk documents wait in their lane (a Redis list) instead of the Celery queue. A feeder moves the
first stage of one document per lane in turn into the `bulk` queue, keeping that queue short, so
a tenant's giant load and another tenant's ten files advance side by side. Later stages go
straight to the queue: they are bounded by the documents already admitted.
"""

from __future__ import annotations

import json

import redis
from celery import Celery

from shared import tracing
from shared.config import Settings
from shared.queue import enqueue, lane_queues, stage_queue

LANES = "ragline:fair:lanes"  # set of lane keys with waiting work
PENDING = "ragline:fair:pending"  # hash: tenant -> documents waiting in its lanes
CURSOR = "ragline:fair:cursor"
BULK_QUEUE = "bulk"

# Pop one item; drop the lane from the set when it ran dry (atomic, so a concurrent push is never lost).
_POP = """
local item = redis.call('LPOP', KEYS[1])
if not item then
  redis.call('SREM', KEYS[2], KEYS[1])
  return false
end
if redis.call('LLEN', KEYS[1]) == 0 then redis.call('SREM', KEYS[2], KEYS[1]) end
redis.call('HINCRBY', KEYS[3], ARGV[1], -1)
return item
"""


def lane(tenant_id: str, kb_id: str) -> str:
    return f"ragline:fair:lane:{tenant_id}/{kb_id}"


def push(client: redis.Redis, tenant_id: str, kb_id: str, task_name: str, kwargs: dict[str, object]) -> None:
    key = lane(tenant_id, kb_id)
    pipe = client.pipeline(transaction=True)
    # The trace context of the upload waits with the work: the feeder that sends it has none.
    item = {"task": task_name, "kwargs": kwargs, "tenant": tenant_id, "headers": tracing.carrier()}
    pipe.rpush(key, json.dumps(item))
    pipe.sadd(LANES, key)
    pipe.hincrby(PENDING, tenant_id, 1)
    pipe.execute()


def pending(client: redis.Redis, tenant_id: str) -> int:
    value = client.hget(PENDING, tenant_id)
    return int(value) if value else 0


def feed(client: redis.Redis, sender: Celery, settings: Settings, depth: int) -> int:
    """Top the bulk queue up to `depth` tasks, one document per lane in turn; returns how many moved.

    Stages routed to queues of their own (celery.stage_queues) count too: admitted work is bounded
    wherever it waits.
    """
    room = depth - sum(int(client.llen(name)) for name in lane_queues(settings, BULK_QUEUE))
    moved = 0
    pop = client.register_script(_POP)
    while room > 0:
        lanes = sorted(k.decode() for k in client.smembers(LANES))  # type: ignore[union-attr]
        if not lanes:
            break
        start = int(client.incr(CURSOR)) % len(lanes)
        progressed = False
        for key in lanes[start:] + lanes[:start]:
            if room <= 0:
                break
            tenant = key.removeprefix("ragline:fair:lane:").split("/", 1)[0]
            raw = pop(keys=[key, LANES, PENDING], args=[tenant])
            if raw is None:
                continue
            item = json.loads(raw)
            queue = stage_queue(settings, BULK_QUEUE, item["kwargs"]["stage"])
            enqueue(
                sender,
                settings,
                item["task"],
                kwargs=item["kwargs"],
                queue=queue,
                headers=item.get("headers"),
            )
            moved += 1
            room -= 1
            progressed = True
        if not progressed:
            break
    return moved

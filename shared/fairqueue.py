"""Fair admission of bulk work: tenants take turns, and within a tenant its knowledge bases do.

Bulk documents wait in a lane per (tenant, kb) (a Redis list) instead of the Celery queue. A feeder
moves the first stage of one document at a time into the `bulk` queue, keeping that queue short:
each turn goes to the next tenant with waiting work, and inside a tenant's turn to its next
knowledge base. A tenant's share is therefore one turn in N tenants however many knowledge bases
it loads into, and a tenant's giant load and another tenant's ten files advance side by side.
Later stages go straight to the queue: they are bounded by the documents already admitted.

Each lane has a set naming the document versions waiting in it, so the reconciler can tell a
document that waits its turn from one whose lane entry was lost, and send only the latter again.
The set goes with the lane when the lane runs dry, so a name it kept by mistake (an older feeder
popped the entry) holds a document back only until then.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import redis
from celery import Celery

from shared import tracing
from shared.config import Settings
from shared.queue import enqueue, lane_queues, stage_queue

LANE_PREFIX = "ragline:fair:lane:"
LANES = "ragline:fair:lanes"  # set of lane keys with waiting work
PENDING = "ragline:fair:pending"  # hash: tenant -> documents waiting in its lanes
WAITING_PREFIX = "ragline:fair:waiting:"  # per lane, a set: the document versions waiting in it
CURSOR = "ragline:fair:cursor"  # whose turn it is among the tenants
KB_CURSOR = "ragline:fair:kb-cursor"  # hash: tenant -> whose turn it is among its lanes
BULK_QUEUE = "bulk"

# Pop one item; drop the lane from the set when it ran dry (atomic, so a concurrent push is never lost).
# A dry lane's waiting set goes too: whatever it still names waits nowhere.
_POP = """
local item = redis.call('LPOP', KEYS[1])
if not item then
  redis.call('SREM', KEYS[2], KEYS[1])
  redis.call('DEL', KEYS[4])
  return false
end
if redis.call('HINCRBY', KEYS[3], ARGV[1], -1) <= 0 then redis.call('HDEL', KEYS[3], ARGV[1]) end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[2], KEYS[1])
  redis.call('DEL', KEYS[4])
else
  local ok, decoded = pcall(cjson.decode, item)
  if ok and type(decoded) == 'table' and decoded['member'] then
    redis.call('SREM', KEYS[4], decoded['member'])
  end
end
return item
"""

# Drop a whole lane (its knowledge base is gone) and its counts, atomically.
_PURGE = """
local count = redis.call('LLEN', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[4])
redis.call('SREM', KEYS[2], KEYS[1])
if count > 0 then
  if redis.call('HINCRBY', KEYS[3], ARGV[1], -count) <= 0 then redis.call('HDEL', KEYS[3], ARGV[1]) end
end
return count
"""


def lane(tenant_id: str, kb_id: str) -> str:
    return f"{LANE_PREFIX}{tenant_id}/{kb_id}"


def waiting_set(lane_key: str) -> str:
    """The set naming what waits in a lane (dropped with the lane when it runs dry)."""
    return WAITING_PREFIX + lane_key.removeprefix(LANE_PREFIX)


def lane_tenant(key: str) -> str:
    """The tenant of a lane key (tenant ids hold no "/")."""
    return key.removeprefix(LANE_PREFIX).split("/", 1)[0]


def member(doc_id: str, content_version: int) -> str:
    """How a waiting document version is named in its lane's waiting set (JSON: ids hold anything)."""
    return json.dumps([doc_id, content_version])


def push(
    client: redis.Redis,
    tenant_id: str,
    kb_id: str,
    task_name: str,
    kwargs: dict[str, Any],
    headers: dict[str, str] | None = None,
    *,
    front: bool = False,
) -> None:
    """Put a document's first stage in its lane; `kwargs` names the document (a StageRef's).

    `front`: at the lane's head, for a document that had its turn already and lost its work (its
    worker died mid-parse); at the tail it would wait for everything its tenant queued since.
    """
    key = lane(tenant_id, kb_id)
    name = member(kwargs["doc_id"], kwargs["content_version"])
    # The trace context of the upload (or `headers` saved with it) waits with the work: the
    # feeder that sends it has none.
    item = {
        "task": task_name,
        "kwargs": kwargs,
        "tenant": tenant_id,
        "member": name,
        "headers": tracing.carrier() if headers is None else headers,
    }
    pipe = client.pipeline(transaction=True)
    (pipe.lpush if front else pipe.rpush)(key, json.dumps(item))
    pipe.sadd(LANES, key)
    pipe.hincrby(PENDING, tenant_id, 1)
    pipe.sadd(waiting_set(key), name)
    pipe.execute()


def is_waiting(client: redis.Redis, tenant_id: str, kb_id: str, doc_id: str, content_version: int) -> bool:
    """Whether this version of the document waits in its lane (a feeder will send it)."""
    key = waiting_set(lane(tenant_id, kb_id))
    return bool(client.sismember(key, member(doc_id, content_version)))


def pending(client: redis.Redis, tenant_id: str) -> int:
    value = client.hget(PENDING, tenant_id)
    return max(0, int(value)) if value else 0


def purge(client: redis.Redis, tenant_id: str, kb_id: str) -> int:
    """Drop the lane of a deleted knowledge base; returns how many documents it held."""
    script = client.register_script(_PURGE)
    key = lane(tenant_id, kb_id)
    return int(script(keys=[key, LANES, PENDING, waiting_set(key)], args=[tenant_id]))


def lanes_by_tenant(lanes: list[str]) -> dict[str, list[str]]:
    """Lane keys grouped by tenant, each tenant's in a stable order."""
    grouped: dict[str, list[str]] = defaultdict(list)
    for key in sorted(lanes):
        grouped[lane_tenant(key)].append(key)
    return dict(grouped)


def rotated(items: list[str], turn: int) -> list[str]:
    """`items` starting at position `turn` (modulo their count), wrapping around."""
    start = turn % len(items)
    return items[start:] + items[:start]


def feed(client: redis.Redis, sender: Celery, settings: Settings, depth: int) -> int:
    """Top the bulk queue up to `depth` tasks, one document per tenant in turn; returns how many moved.

    Stages routed to queues of their own (celery.stage_queues) count too: admitted work is bounded
    wherever it waits.
    """
    room = depth - sum(int(client.llen(name)) for name in lane_queues(settings, BULK_QUEUE))
    moved = 0
    pop = client.register_script(_POP)
    while room > 0:
        tenants = lanes_by_tenant([k.decode() for k in client.smembers(LANES)])  # type: ignore[union-attr]
        if not tenants:
            break
        progressed = False
        for tenant in rotated(sorted(tenants), int(client.incr(CURSOR))):
            if room <= 0:
                break
            item = _pop_for(client, pop, tenant, tenants[tenant])
            if item is None:
                continue
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


def _pop_for(client: redis.Redis, pop: Any, tenant: str, lanes: list[str]) -> dict[str, Any] | None:
    """The next document of one tenant's turn: its knowledge bases take turns in turn."""
    for key in rotated(lanes, int(client.hincrby(KB_CURSOR, tenant, 1))):
        raw = pop(keys=[key, LANES, PENDING, waiting_set(key)], args=[tenant])
        if raw is not None:
            item: dict[str, Any] = json.loads(raw)
            return item
    return None

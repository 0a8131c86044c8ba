"""The bytes of request bodies a process holds whole in memory at once, across its requests.

An MCP message and a JSON upload are read whole and then parsed: the process holds several copies
of each (the bytes, the decoded text, the parsed object, the file's bytes), so four ingests of
the largest file through MCP took an API process from 0.3 to 2.3 GB, each within its own body
limit. The fronts reserve a body's bytes here as they read it and give them back once its request
is answered. A request that would pass the budget is refused at once (503 UNAVAILABLE with
Retry-After), never queued: a queue of held bodies is the same memory. One request is always let
through when nothing is held, whatever its size (its own limit bounds it), as the bulk backlog
takes a request larger than its bound when nothing waits.

The event loop is the only caller of a process's budget, so it needs no lock.
"""

from __future__ import annotations

from shared.errors import ErrorCode, RaglineError

RETRY_AFTER_S = 2


class BufferBudget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.held = 0

    def take(self, size: int, already: int) -> None:
        """Reserve `size` more bytes for a request that holds `already`; UNAVAILABLE past the budget
        unless it is the only request holding any."""
        alone = self.held == already
        if self.held + size > self.limit_bytes and not alone:
            raise RaglineError(
                "the server is reading other large requests; retry shortly",
                code=ErrorCode.UNAVAILABLE,
                details={"retry_after": RETRY_AFTER_S},
            )
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size


# Each process's budget, sized by `configure` when its app is built (the API or `ragline mcp`).
BUDGET = BufferBudget(256 << 20)


def configure(limit_bytes: int) -> None:
    BUDGET.limit_bytes = limit_bytes

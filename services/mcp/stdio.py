"""`ragline mcp`: the MCP server over stdio, as a desktop client starts it, stack up or not.

With OpenSearch or Redis down it still starts, says so in one line on stderr, and answers each
tool call `UNAVAILABLE: ...` until the service is back. A desktop client shows a server that
exited at startup only as "failed" (its log holds a stack trace nobody reads); a tool error
reaches the user and the model in the conversation, and the calls work once the stack is up.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

import redis

from services.core.auth import Principal, Role
from services.core.container import AppState, build_state
from services.mcp.outage import HOW_TO_START, unreachable
from services.mcp.server import build_mcp
from shared import logs
from shared.config import Settings

log = logging.getLogger(__name__)
PREPARE_EVERY_S = 5.0
REDIS_CHECK_TIMEOUT_S = 2.0


def serve_stdio(settings: Settings) -> None:
    """Serve MCP on stdin/stdout as `settings.tenant` with the admin role, until stdin closes."""
    # Ragline's log handler before FastMCP's: its rich handler drew each failed OpenSearch request
    # as a screen-long traceback on stderr, which a desktop client keeps in its log.
    logs.configure("mcp", settings.log_level, settings.log_format, logs.secret_values(settings))
    state = build_state(settings, http=False)
    down = _down_services(state)
    if down:
        names = " and ".join(f"{name} ({where})" for name, where in down)
        print(
            f"ragline mcp: {names} unreachable; serving anyway, the tools that need it answer "
            f"UNAVAILABLE until it is up ({HOW_TO_START})",
            file=sys.stderr,
            flush=True,
        )
    principal = Principal(settings.tenant, Role.ADMIN, "stdio")
    build_mcp(state, stdio_principal=principal).run(transport="stdio")


def _down_services(state: AppState) -> list[tuple[str, str]]:
    """Prepare the indexes and ping Redis, each bounded; what did not answer, with its URL."""
    settings = state.settings
    down = []
    try:
        state.prepare_indexes()
    except Exception as error:
        if unreachable(error) is None:
            raise  # not an outage: a real fault, shown as one
        down.append(("OpenSearch", settings.opensearch.url))
        threading.Thread(target=_prepare_when_up, args=(state,), name="prepare-indexes", daemon=True).start()
    probe = redis.Redis.from_url(
        settings.redis.url,
        socket_connect_timeout=REDIS_CHECK_TIMEOUT_S,
        socket_timeout=REDIS_CHECK_TIMEOUT_S,
    )
    try:
        probe.ping()
    except redis.RedisError:
        down.append(("Redis", settings.redis.url.rsplit("@", 1)[-1]))
    finally:
        probe.close()
    return down


def _prepare_when_up(state: AppState) -> None:
    """Create the indexes once OpenSearch answers, so the first calls after it is up find them."""
    while True:
        time.sleep(PREPARE_EVERY_S)
        try:
            state.prepare_indexes()
        except Exception as error:  # noqa: BLE001  (still down: try again; anything else: say so once)
            if unreachable(error) is None:
                log.warning("could not prepare the indexes: %s", type(error).__name__)
                return
            continue
        log.info("OpenSearch is up: indexes ready")
        return

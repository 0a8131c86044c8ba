"""How both HTTP fronts (the API, the standalone MCP server) run under uvicorn: one place for it."""

from __future__ import annotations

from typing import Any

import uvicorn

from services.core.slow_clients import header_timeout
from shared.config import Settings

# An idle keep-alive connection is closed after this long. Longer than the clients' own expiry of
# idle connections (httpx's and most pools': 5 s, uvicorn's default too): at equal bounds a client
# may send its next request on a connection the server is closing that moment, and the request is
# lost to a reset connection, the more often the busier the server.
KEEP_ALIVE_S = 15


def run(app: Any, settings: Settings, host: str, port: int) -> None:
    """Serve `app` on host:port until stopped."""
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        log_config=None,  # uvicorn's loggers go through Ragline's handler (see shared/logs.py)
        proxy_headers=False,
        server_header=False,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=header_timeout(settings.api.header_timeout_s),
    )

"""How both HTTP fronts (the API, the standalone MCP server) run under uvicorn: one place for it."""

from __future__ import annotations

from typing import Any

import uvicorn

from services.core.slow_clients import header_timeout
from shared.config import Settings


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
        http=header_timeout(settings.api.header_timeout_s),
    )

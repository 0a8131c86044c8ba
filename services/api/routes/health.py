"""Liveness, readiness and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from services.api.deps import State
from shared.queue import ping_workers

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


def _checks(state: State) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    try:
        health = state.client.cluster.health(request_timeout=2)
        checks["opensearch"] = {"ok": health["status"] in ("green", "yellow"), "status": health["status"]}
    except Exception as error:  # noqa: BLE001
        checks["opensearch"] = {"ok": False, "error": type(error).__name__}
    try:
        checks["redis"] = {"ok": bool(state.redis.ping())}
    except Exception as error:  # noqa: BLE001
        checks["redis"] = {"ok": False, "error": type(error).__name__}
    try:
        replies = ping_workers(state.sender, timeout_s=1.0)
        checks["workers"] = {"ok": bool(replies), "count": len(replies or [])}
    except Exception as error:  # noqa: BLE001
        checks["workers"] = {"ok": False, "error": type(error).__name__}
    return checks


@router.get("/readyz")
async def readyz(state: State) -> JSONResponse:
    """OpenSearch, Redis and at least one worker answer."""
    checks = await run_in_threadpool(_checks, state)
    ready = all(c["ok"] for c in checks.values())
    return JSONResponse(status_code=200 if ready else 503, content={"ready": ready, "checks": checks})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    rendered: Response = await run_in_threadpool(request.app.state.metrics.render)
    return rendered

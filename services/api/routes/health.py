"""Liveness, readiness and metrics: answered on the event loop, never waiting for a shared thread."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.metrics import Metrics
from services.api.readiness import Readiness

router = APIRouter(tags=["health"])


@router.api_route("/healthz", methods=["GET", "HEAD"])  # load balancers probe with HEAD
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


@router.api_route("/readyz", methods=["GET", "HEAD"])  # load balancers probe with HEAD
async def readyz(request: Request) -> JSONResponse:
    """OpenSearch, Redis and at least one worker answer."""
    readiness: Readiness = request.app.state.readiness
    answer = await readiness.answer()
    return JSONResponse(status_code=200 if answer["ready"] else 503, content=answer)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus exposition."""
    exposition: Metrics = request.app.state.metrics
    return await exposition.render()

"""Liveness, readiness and metrics: answered on the event loop, never waiting for a shared thread."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from services.api.metrics import Metrics
from services.api.readiness import Readiness

router = APIRouter(tags=["health"])


# Load balancers probe with HEAD. The GET route is only the schema's entry (one route of two
# methods would give OpenAPI one operation id twice); requests meet the route below it.
@router.get("/healthz")
@router.api_route("/healthz", methods=["GET", "HEAD"], include_in_schema=False)
async def healthz() -> dict[str, str]:
    """The process is alive."""
    return {"status": "ok"}


# Load balancers probe with HEAD. The GET route is only the schema's entry (one route of two
# methods would give OpenAPI one operation id twice); requests meet the route below it.
@router.get("/readyz")
@router.api_route("/readyz", methods=["GET", "HEAD"], include_in_schema=False)
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

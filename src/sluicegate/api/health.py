"""`GET /health` (the process answers), `GET /ready` (the engine can serve), `GET /metrics`
(every series) and `GET /metrics/engine` (the engine's scheduling state, for routers)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from sluicegate.api.deps import StateDep
from sluicegate.errors import EngineUnavailableError, ShuttingDownError
from sluicegate.observability.exposition import engine_state, exposition

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(state: StateDep) -> JSONResponse:
    try:
        if state.lifecycle.draining:
            raise ShuttingDownError()
        await state.engine.check_health()
    except EngineUnavailableError as exc:
        return JSONResponse({"status": "unavailable", **exc.to_body()}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", response_model=None)
async def metrics() -> Response:
    # vLLM's engine registers its `vllm:*` series on the default registry; ours join them.
    return Response(await exposition.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/engine", response_model=None)
async def engine_metrics() -> Response:
    # An endpoint picker polls this every 50 ms: a handful of samples, not the whole registry.
    return Response(await engine_state.render(), media_type=CONTENT_TYPE_LATEST)

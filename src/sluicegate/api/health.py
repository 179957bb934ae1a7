"""`GET /health` (the process answers), `GET /ready` (the engine can serve), `GET /metrics`."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from sluicegate.api.deps import StateDep
from sluicegate.errors import EngineUnavailableError, ShuttingDownError

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
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

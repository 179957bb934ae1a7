"""`GET /health` (the process answers), `GET /ready` (the engines can serve), `GET /metrics`
(every series) and `GET /metrics/engine` (the engine's scheduling state, for routers).

Ready means: not draining, the in-process engine (if there is one) healthy, and at least one
engine able to serve. A pool whose upstreams are all down does not make the gateway unready
(its other models still serve, and its fallbacks answer for it); `models` in the body says
which models can serve now."""

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
    registry = state.models
    if state.lifecycle.draining:
        return _unavailable(ShuttingDownError())
    engines = registry.engines()
    problems: dict[int, EngineUnavailableError] = {}
    for engine in engines:
        try:
            await engine.check_health()
        except EngineUnavailableError as exc:
            problems[id(engine)] = exc
    for engine in registry.local_engines():
        if id(engine) in problems:
            return _unavailable(problems[id(engine)])
    if len(problems) == len(engines):
        return _unavailable(next(iter(problems.values())))
    models = {
        name: "unavailable" if id(registry.engine_of(name)) in problems else "ready"
        for name in registry.names()
    }
    return JSONResponse({"status": "ready", "models": models})


def _unavailable(exc: EngineUnavailableError) -> JSONResponse:
    return JSONResponse({"status": "unavailable", **exc.to_body()}, status_code=503)


@router.get("/metrics", response_model=None)
async def metrics() -> Response:
    # vLLM's engine registers its `vllm:*` series on the default registry; ours join them.
    return Response(await exposition.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/engine", response_model=None)
async def engine_metrics() -> Response:
    # An endpoint picker polls this every 50 ms: a handful of samples, not the whole registry.
    return Response(await engine_state.render(), media_type=CONTENT_TYPE_LATEST)

"""`GET /health` (the process answers), `GET /ready` (the engines can serve), `GET /metrics`
(every series) and `GET /metrics/engine` (the engine's scheduling state, for routers).

Ready means: not draining, the in-process engine (if there is one) healthy, and at least one
engine able to serve. A pool whose upstreams are all down does not make the gateway unready
(its other models still serve, and its fallbacks answer for it); `models` in the body says
which models can serve now.

With managed keys, the tenants' keys are not to learn of each other nor of every model:
`/metrics` (whose per-key series name keys) answers admin and scraper keys only
(`METRICS_API_KEYS`), and `/ready` names its models only to them. `/metrics/engine`, for
routers, stays open."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from sluicegate.api.deps import StateDep
from sluicegate.errors import EngineUnavailableError, PermissionDeniedError, ShuttingDownError
from sluicegate.http.asgi import reads_metrics
from sluicegate.http.state import AppState
from sluicegate.observability.exposition import engine_state, exposition

router = APIRouter(tags=["health"])


@router.get("/health")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/ready", response_model=None)
async def ready(request: Request, state: StateDep) -> JSONResponse:
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
    if not _shows_detail(request, state):
        return JSONResponse({"status": "ready"})
    models = {
        name: "unavailable" if id(registry.engine_of(name)) in problems else "ready"
        for name in registry.names()
    }
    return JSONResponse({"status": "ready", "models": models})


def _shows_detail(request: Request, state: AppState) -> bool:
    """Whether the caller may see what names keys and models (the metrics, the models)."""
    return not state.access.managed or reads_metrics(request.scope)


def _unavailable(exc: EngineUnavailableError) -> JSONResponse:
    return JSONResponse({"status": "unavailable", **exc.to_body()}, status_code=503)


@router.get("/metrics", response_model=None)
async def metrics(request: Request, state: StateDep) -> Response:
    if not _shows_detail(request, state):
        raise PermissionDeniedError(
            "With managed keys, /metrics is for admin keys and the keys of "
            "SLUICEGATE_METRICS_API_KEYS."
        )
    # vLLM's engine registers its `vllm:*` series on the default registry; ours join them.
    return Response(await exposition.render(), media_type=CONTENT_TYPE_LATEST)


@router.get("/metrics/engine", response_model=None)
async def engine_metrics() -> Response:
    # An endpoint picker polls this every 50 ms: a handful of samples, not the whole registry.
    return Response(await engine_state.render(), media_type=CONTENT_TYPE_LATEST)

"""`GET /v1/models` and `GET /v1/models/{model}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sluicegate.api.deps import EngineDep, SettingsDep, StartedAtDep
from sluicegate.engine.protocol import EngineClient
from sluicegate.errors import ModelNotFoundError
from sluicegate.protocol import ModelCard
from sluicegate.settings import Settings

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models")
async def list_models(
    settings: SettingsDep, engine: EngineDep, started_at: StartedAtDep
) -> dict[str, Any]:
    return {"object": "list", "data": [_card(settings, engine, started_at)]}


@router.get("/models/{model:path}")
async def retrieve_model(
    model: str, settings: SettingsDep, engine: EngineDep, started_at: StartedAtDep
) -> ModelCard:
    if model != settings.model_name:
        raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")
    return _card(settings, engine, started_at)


def _card(settings: Settings, engine: EngineClient, started_at: int) -> ModelCard:
    return {
        "id": settings.model_name,
        "object": "model",
        "created": started_at,
        "owned_by": "sluicegate",
        "root": settings.model or settings.model_name,
        "max_model_len": engine.max_model_len,
    }

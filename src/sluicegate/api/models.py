"""`GET /v1/models` and `GET /v1/models/{model}`: every model, adapter and alias served."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sluicegate.api.deps import ModelsDep
from sluicegate.errors import ModelNotFoundError
from sluicegate.wire.formats import ModelCard

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models")
async def list_models(models: ModelsDep) -> dict[str, Any]:
    return {"object": "list", "data": models.cards()}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, models: ModelsDep) -> ModelCard:
    for card in models.cards():
        if card["id"] == model:
            return card
    raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")

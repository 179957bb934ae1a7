"""`GET /v1/models` and `GET /v1/models/{model}`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from sluicegate.api.deps import StateDep
from sluicegate.errors import ModelNotFoundError
from sluicegate.http.state import AppState
from sluicegate.wire.formats import ModelCard

router = APIRouter(prefix="/v1", tags=["models"])


@router.get("/models")
async def list_models(state: StateDep) -> dict[str, Any]:
    return {"object": "list", "data": [_card(state)]}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, state: StateDep) -> ModelCard:
    if model != state.model_name:
        raise ModelNotFoundError(f"The model `{model}` does not exist.", param="model")
    return _card(state)


def _card(state: AppState) -> ModelCard:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.started_at,
        "owned_by": "sluicegate",
        "root": state.model_root,
        "max_model_len": state.engine.max_model_len,
    }

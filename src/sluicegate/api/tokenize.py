"""`POST /tokenize` and `POST /detokenize`, shaped as vLLM's server answers them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sluicegate.api.deps import ModelsDep
from sluicegate.api.route import CountedRoute
from sluicegate.inference.tokenization import TokenizationService
from sluicegate.models.permitted import PermittedModels
from sluicegate.wire.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["tokenize"], route_class=CountedRoute)


def tokenization(models: PermittedModels, model: str | None) -> TokenizationService:
    """The tokenizer of the request's model (an alias resolved), or of the first model."""
    served = models.default if model is None else models.resolve_any(model)
    return TokenizationService(served.engine)


# JSONResponse: the answer is plain data already; FastAPI's response validation would walk
# every id of a long text again.
@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, models: ModelsDep) -> JSONResponse:
    return JSONResponse(await tokenization(models, body.model).tokenize(body))


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, models: ModelsDep) -> JSONResponse:
    return JSONResponse(await tokenization(models, body.model).detokenize(body))

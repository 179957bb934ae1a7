"""`POST /tokenize` and `POST /detokenize`, shaped as vLLM's server answers them."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from sluicegate.api.deps import StateDep
from sluicegate.api.route import CountedRoute
from sluicegate.http.state import AppState
from sluicegate.inference.tokenization import TokenizationService
from sluicegate.wire.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["tokenize"], route_class=CountedRoute)


def tokenization(state: AppState, model: str | None) -> TokenizationService:
    """The tokenizer of the request's model (an alias resolved), or of the first model."""
    served = state.models.default if model is None else state.models.resolve_any(model)
    return TokenizationService(served.engine)


# JSONResponse: the answer is plain data already; FastAPI's response validation would walk
# every id of a long text again.
@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, state: StateDep) -> JSONResponse:
    return JSONResponse(await tokenization(state, body.model).tokenize(body))


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, state: StateDep) -> JSONResponse:
    return JSONResponse(await tokenization(state, body.model).detokenize(body))

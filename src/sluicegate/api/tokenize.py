"""`POST /tokenize` and `POST /detokenize`, shaped as vLLM's server answers them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse

from sluicegate.api.deps import StateDep
from sluicegate.api.route import CountedRoute
from sluicegate.inference.tokenization import TokenizationService
from sluicegate.wire.tokenize import DetokenizeRequest, TokenizeRequest

router = APIRouter(tags=["tokenize"], route_class=CountedRoute)


async def get_tokenization(state: StateDep) -> TokenizationService:
    return TokenizationService(state.engine, state.model_name)


TokenizationDep = Annotated[TokenizationService, Depends(get_tokenization)]


# JSONResponse: the answer is plain data already; FastAPI's response validation would walk
# every id of a long text again.
@router.post("/tokenize", response_model=None)
async def tokenize(body: TokenizeRequest, service: TokenizationDep) -> JSONResponse:
    return JSONResponse(await service.tokenize(body))


@router.post("/detokenize", response_model=None)
async def detokenize(body: DetokenizeRequest, service: TokenizationDep) -> JSONResponse:
    return JSONResponse(await service.detokenize(body))

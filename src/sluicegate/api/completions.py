"""`POST /v1/chat/completions` and `POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import ServiceDep
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest
from sluicegate.service import CompletionService, Run
from sluicegate.streaming import open_event_stream, until_disconnect

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, service: ServiceDep
) -> Response:
    run = await service.prepare_chat(body)
    return await _respond(run, body.stream, request, service)


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, service: ServiceDep
) -> Response:
    run = await service.prepare_completion(body)
    return await _respond(run, body.stream, request, service)


async def _respond(
    run: Run, stream: bool, request: Request, service: CompletionService
) -> Response:
    if stream:
        return await open_event_stream(request.receive, service.stream(run))
    body = await until_disconnect(request.receive, service.collect(run))
    return JSONResponse(body)

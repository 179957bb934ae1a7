"""`POST /v1/chat/completions` and `POST /v1/completions`."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import ServiceDep, SettingsDep
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest
from sluicegate.service import CompletionService, Run
from sluicegate.settings import Settings
from sluicegate.streaming import open_event_stream, until_disconnect

router = APIRouter(prefix="/v1", tags=["completions"])


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, service: ServiceDep, settings: SettingsDep
) -> Response:
    run = await service.prepare_chat(body)
    return await _respond(run, body.stream, request, service, settings)


@router.post("/completions", response_model=None)
async def create_completion(
    body: CompletionRequest, request: Request, service: ServiceDep, settings: SettingsDep
) -> Response:
    run = await service.prepare_completion(body)
    return await _respond(run, body.stream, request, service, settings)


async def _respond(
    run: Run, stream: bool, request: Request, service: CompletionService, settings: Settings
) -> Response:
    if stream:
        return await open_event_stream(
            request.receive,
            service.stream(run),
            time_limit=settings.request_timeout,
            stall_limit=settings.stream_stall_timeout,
        )
    body = await until_disconnect(
        request.receive, service.collect(run), time_limit=settings.request_timeout
    )
    return JSONResponse(body)

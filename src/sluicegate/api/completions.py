"""`POST /v1/chat/completions` and `POST /v1/completions`."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import KeyIdDep, QuotasDep, ServiceDep, SettingsDep
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest
from sluicegate.quota import Quotas
from sluicegate.service import CompletionService, Run
from sluicegate.settings import Settings
from sluicegate.streaming import open_event_stream, until_disconnect

router = APIRouter(prefix="/v1", tags=["completions"])


@dataclass(frozen=True, slots=True)
class CompletionContext:
    """What the completion routes take from the lifespan and the request."""

    service: CompletionService
    settings: Settings
    quotas: Quotas
    key_id: str


def completion_context(
    service: ServiceDep, settings: SettingsDep, quotas: QuotasDep, key_id: KeyIdDep
) -> CompletionContext:
    return CompletionContext(service, settings, quotas, key_id)


Context = Annotated[CompletionContext, Depends(completion_context)]


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, ctx: Context
) -> Response:
    run = await ctx.service.prepare_chat(body)
    return await _respond(run, body.stream, request, ctx)


@router.post("/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, ctx: Context) -> Response:
    run = await ctx.service.prepare_completion(body)
    return await _respond(run, body.stream, request, ctx)


async def _respond(run: Run, stream: bool, request: Request, ctx: CompletionContext) -> Response:
    """The path of an inference request once it is tokenized: quota, engine, response."""
    settings, quotas, key_id = ctx.settings, ctx.quotas, ctx.key_id
    headers = await quotas.admit(key_id, run.prompt_tokens)
    if stream:
        return await open_event_stream(
            request.receive,
            ctx.service.stream(run, on_finish=partial(quotas.settle, key_id)),
            headers=headers,
            time_limit=settings.request_timeout,
            stall_limit=settings.stream_stall_timeout,
        )
    body = await until_disconnect(
        request.receive, ctx.service.collect(run), time_limit=settings.request_timeout
    )
    await quotas.settle(key_id, body["usage"]["completion_tokens"])
    return JSONResponse(body, headers=headers)

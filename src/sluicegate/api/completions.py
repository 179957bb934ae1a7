"""`POST /v1/chat/completions` and `POST /v1/completions`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.deps import get_cache, get_key_id, get_quotas, get_service, get_settings
from sluicegate.cache import CacheControl, ResponseCache
from sluicegate.cache.fast_path import FINGERPRINT
from sluicegate.observability.record import current_request
from sluicegate.observability.tracing import span
from sluicegate.protocol import ChatCompletionRequest, CompletionRequest
from sluicegate.quota import Quotas
from sluicegate.responses import Completion
from sluicegate.service import CompletionService, Run
from sluicegate.settings import Settings
from sluicegate.streaming import open_event_stream, until_disconnect

router = APIRouter(prefix="/v1", tags=["completions"])
# Tokenizing the request and fitting it to the context window: the token budget.
TOKEN_BUDGET_SPAN = "token_budget"


@dataclass(frozen=True, slots=True)
class CompletionContext:
    """What the completion routes take from the lifespan and the request."""

    service: CompletionService
    settings: Settings
    quotas: Quotas
    cache: ResponseCache
    key_id: str


async def completion_context(request: Request) -> CompletionContext:
    # One dependency instead of five: FastAPI's dependency solving is a measurable share of
    # a cache hit's time.
    return CompletionContext(
        await get_service(request),
        await get_settings(request),
        await get_quotas(request),
        await get_cache(request),
        await get_key_id(request),
    )


Context = Annotated[CompletionContext, Depends(completion_context)]


@router.post("/chat/completions", response_model=None)
async def create_chat_completion(
    body: ChatCompletionRequest, request: Request, ctx: Context
) -> Response:
    with span(TOKEN_BUDGET_SPAN):
        run = await ctx.service.prepare_chat(body)
    return await _respond(run, body.stream, request, ctx)


@router.post("/completions", response_model=None)
async def create_completion(body: CompletionRequest, request: Request, ctx: Context) -> Response:
    with span(TOKEN_BUDGET_SPAN):
        run = await ctx.service.prepare_completion(body)
    return await _respond(run, body.stream, request, ctx)


async def _respond(run: Run, stream: bool, request: Request, ctx: CompletionContext) -> Response:
    """The path of an inference request once it is tokenized: quota, cache, engine, response."""
    settings, quotas, key_id = ctx.settings, ctx.quotas, ctx.key_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.request_timeout
    headers = {**await quotas.admit(key_id, run.prompt_tokens)}
    if run.budget is not None:
        headers.update(run.budget.headers())
    control = CacheControl.parse(request.headers.get("cache-control"))
    lookup = await ctx.cache.lookup(
        run,
        request.scope["path"],
        key_id,
        control,
        wait=lambda work: until_disconnect(request.receive, work, deadline - loop.time()),
        fingerprint=getattr(request.state, FINGERPRINT, None),
        stream=stream,
    )
    headers.update(lookup.headers())
    lease, cached = lookup.lease, lookup.completion
    if cached is not None and (record := current_request()) is not None:
        record.add_usage(cached.prompt_tokens, cached.completion_tokens)  # for the access log

    async def finish(completion: Completion) -> None:
        await quotas.settle(key_id, completion.completion_tokens)
        await lease.fulfil(completion)

    if stream:
        events = (
            ctx.service.stream(run, on_finish=finish)
            if cached is None
            else ctx.service.replay(run, cached, on_finish=finish)
        )
        return await open_event_stream(
            request.receive,
            lease.guard(events),
            headers=headers,
            time_limit=deadline - loop.time(),
            stall_limit=settings.stream_stall_timeout,
        )
    try:
        if cached is None:
            completion = await until_disconnect(
                request.receive, ctx.service.collect(run), time_limit=deadline - loop.time()
            )
        else:
            completion = cached
        await finish(completion)
    finally:
        lease.close()
    return JSONResponse(run.format.response(completion), headers=headers)

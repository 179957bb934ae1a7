"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A Messages request runs as a chat completion: its turns and parameters become a chat request
(`wire.messages.chat_body`), which is prepared on its model and answered by the same
`Exchange` as `/v1/chat/completions` (keys, rate limits, cache, token budget, fallbacks,
metrics, traces), rendered as a message object or Anthropic's stream events
(`wire.message_format`). Errors on these paths are in Anthropic's shape, with its statuses
(`http.errors.rendered`); the key may come as `x-api-key` (`http.auth`), and the
`anthropic-version` and `anthropic-beta` headers are taken and need nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.completions import Prepared, respond
from sluicegate.api.deps import StateDep, models_for
from sluicegate.api.route import CountedRoute, LargeBodyRoute
from sluicegate.errors import InvalidRequestError
from sluicegate.http.errors import validated
from sluicegate.models.served import ServedModel
from sluicegate.wire.message_body import MessageEnvelope
from sluicegate.wire.message_format import MessagesFormat
from sluicegate.wire.messages import (
    CountTokensRequest,
    MessagesRequest,
    UnsupportedBlockError,
    param_for,
)
from sluicegate.wire.requests import ChatCompletionRequest

router = APIRouter(prefix="/v1", tags=["messages"], route_class=LargeBodyRoute)
counting = APIRouter(prefix="/v1", tags=["messages"], route_class=CountedRoute)


@router.post("/messages", response_model=None)
async def create_message(body: MessagesRequest, request: Request, state: StateDep) -> Response:
    chat = chat_request(body.chat_body)

    async def prepare(model: ServedModel) -> Prepared:
        try:
            run = await model.service.prepare_chat(chat)
        except InvalidRequestError as exc:
            exc.param = None if exc.param is None else param_for(exc.param)
            raise
        fmt = MessagesFormat(run.format, MessageEnvelope(model.name), run.prompt_tokens)
        return Prepared(dataclasses.replace(run, format=fmt))

    return await respond(body.model, body.stream, request, state, prepare)


@counting.post("/messages/count_tokens", response_model=None)
async def count_tokens(body: CountTokensRequest, request: Request, state: StateDep) -> Response:
    """The input tokens the token budget counts for the request on its model."""
    model = models_for(request, state).resolve(body.model)
    try:
        count = await model.service.count_chat(chat_request(body.chat_body))
    except InvalidRequestError as exc:
        exc.param = None if exc.param is None else param_for(exc.param)
        raise
    return JSONResponse({"input_tokens": count})


def chat_request(make: Callable[[], dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request `make()` builds, validated; what it refuses is a 400 naming the
    Messages parameter."""
    try:
        body = make()
    except UnsupportedBlockError as exc:
        raise InvalidRequestError(str(exc), param=exc.param) from None
    return validated(ChatCompletionRequest, body, param_for)

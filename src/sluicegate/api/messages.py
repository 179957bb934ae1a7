"""Anthropic's Messages API: `POST /v1/messages` and `POST /v1/messages/count_tokens`.

A Messages request runs as a chat completion: its turns and parameters become a chat request
(`wire.messages.chat_body`), which is prepared on its model and answered by the same
`Exchange` as `/v1/chat/completions` (keys, rate limits, cache, token budget, fallbacks,
metrics, traces), rendered as a message object or Anthropic's stream events
(`wire.message_format`), its thoughts signed by the gateway's seal (`AppState.reasoning_seal`).
Thinking blocks sent back in assistant turns are verified against that seal here, on the
event loop, before any engine work (the conversion may have run in a worker process, which
holds no key). Errors on these paths are in Anthropic's shape, with its statuses
(`http.errors.rendered`); the key may come as `x-api-key` (`http.auth`), and the
`anthropic-version` and `anthropic-beta` headers are taken and need nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.completions import Prepared, respond
from sluicegate.api.deps import StateDep, models_for
from sluicegate.api.route import CountedRoute, LargeBodyRoute
from sluicegate.engine.protocol import EngineClient
from sluicegate.errors import InvalidRequestError, MediaError
from sluicegate.http.errors import validated
from sluicegate.inference.images import RequestImages
from sluicegate.media.loader import MediaLoader
from sluicegate.models.served import ServedModel
from sluicegate.wire.message_body import MessageEnvelope
from sluicegate.wire.message_format import MessagesFormat
from sluicegate.wire.message_thinking import SignedThought
from sluicegate.wire.messages import (
    CountTokensRequest,
    MessagesRequest,
    UnsupportedBlockError,
    param_for,
)
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.requests import ChatCompletionRequest

router = APIRouter(prefix="/v1", tags=["messages"], route_class=LargeBodyRoute)
counting = APIRouter(prefix="/v1", tags=["messages"], route_class=CountedRoute)


@router.post("/messages", response_model=None)
async def create_message(body: MessagesRequest, request: Request, state: StateDep) -> Response:
    chat = chat_request(body.chat_body)
    seal = state.reasoning_seal
    verify_thoughts(body.signed_thoughts(), seal)
    images = message_images(body, chat, state.media)

    async def prepare(model: ServedModel) -> Prepared:
        try:
            run = await model.service.prepare_chat(for_engine(chat, model.engine), images)
        except InvalidRequestError as exc:
            if not isinstance(exc, MediaError):  # an image's error names its block already
                exc.param = None if exc.param is None else param_for(exc.param)
            raise
        envelope = MessageEnvelope(model.name, seal)
        fmt = MessagesFormat(run.format, envelope, run.prompt_tokens)
        return Prepared(dataclasses.replace(run, format=fmt))

    return await respond(body.model, body.stream, request, state, prepare, images is not None)


def message_images(
    body: MessagesRequest | CountTokensRequest, chat: ChatCompletionRequest, loader: MediaLoader
) -> RequestImages | None:
    """The chat's images, each named by its block of the Messages request."""
    parts = chat.image_parts()
    if not parts:
        return None
    named = list(zip(body.image_params(), (image for _, image in parts), strict=True))
    return RequestImages(named, loader, part_type="image")


def verify_thoughts(thoughts: Iterable[SignedThought], seal: ReasoningSeal) -> None:
    """Refuses a thinking block this gateway did not sign for its text: what comes back is put
    into the prompt as the model's own thoughts."""
    for thought in thoughts:
        if not seal.verify_digest(thought.digest, thought.signature):
            raise InvalidRequestError(
                f"{thought.param}: this thinking block's signature is not this server's for "
                "its text. Send thinking blocks back as they came, or leave them out.",
                param=thought.param,
            )


def for_engine(chat: ChatCompletionRequest, engine: EngineClient) -> ChatCompletionRequest:
    """`chat` as `engine` can take it: the thinking budget goes to an engine that bounds
    thoughts it parses (the in-process one with a reasoning parser) and to an upstream that
    splits its own (which decides, as its own `/v1/messages` would). The in-process engine
    without a parser cannot tell thoughts apart (vLLM refuses the budget there), nor can an
    upstream whose thoughts the gateway splits (`reasoning_parser:` in the models file: vLLM
    without `--reasoning-parser` refuses it too): the request runs without it."""
    if chat.thinking_token_budget is None:
        return chat
    splits_itself = engine.renders_chat and engine.reasoning_parser is None
    bounds_them = not engine.renders_chat and engine.reasoning_parser is not None
    if splits_itself or bounds_them:
        return chat
    return chat.model_copy(update={"thinking_token_budget": None})


@counting.post("/messages/count_tokens", response_model=None)
async def count_tokens(body: CountTokensRequest, request: Request, state: StateDep) -> Response:
    """The input tokens the token budget counts for the request on its model."""
    model = models_for(request, state).resolve(body.model)
    chat = chat_request(body.chat_body)
    try:
        count = await model.service.count_chat(chat, message_images(body, chat, state.media))
    except InvalidRequestError as exc:
        if not isinstance(exc, MediaError):
            exc.param = None if exc.param is None else param_for(exc.param)
        raise
    return JSONResponse({"input_tokens": count})


def chat_request(make: Callable[[], dict[str, Any]]) -> ChatCompletionRequest:
    """The chat request `make()` builds, validated; what it refuses is a 400 naming the
    Messages parameter (in its message too: Anthropic's error has no `param`)."""
    try:
        body = make()
    except UnsupportedBlockError as exc:
        raise InvalidRequestError(f"{exc.param}: {exc}", param=exc.param) from None
    return validated(ChatCompletionRequest, body, param_for)

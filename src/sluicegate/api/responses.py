"""The Responses API: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`, and
`GET /v1/responses/{id}/input_items`.

A Responses request runs as a chat completion: its conversation (the stored one of
`previous_response_id`, then `input`) becomes a chat request (`wire.responses.chat_body`),
which is prepared and answered by the same `Exchange` as `/v1/chat/completions` (rate
limits, cache, token budget, metrics, traces), rendered as a response object or its events
(`wire.response_format`). With `store` (the default) the response and its conversation are
kept (`conversation.store`) once answered; a store that fails then is logged, and the answer
still goes out (it is already rendered; the client learns of it when it reads the response).
The conversation kept is the one the prompt holds: with `truncation: "auto"`, as fitted. One
the store cannot take (larger than a record may be) is answered with `store: false`.

Reasoning items sent back sealed are opened here, on the event loop, before anything else
(`ResponsesRequest.opened`): a forged one is refused before the store or the engine is asked.
Not in the worker process that parses large bodies (`api.route`): the seal's keys stay in
this process. The work is bounded by the body's size limit (`MAX_REQUEST_BYTES`) and cost
about 11 ms per MB of sealed text on a 2-core CI machine, mostly base64 decoding (GIL held)
(a thread would not free the loop); the conversion and validation this route already does
on the loop cost about 6 ms per MB. From then on the items hold the opened text: stored and
replayed as it, never opened again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from sluicegate.api.completions import Prepared, respond
from sluicegate.api.deps import KeyIdDep, StateDep
from sluicegate.api.route import LargeBodyRoute
from sluicegate.conversation.fitted import fitted_items
from sluicegate.conversation.record import StoredResponse, encode_items
from sluicegate.errors import (
    InvalidRequestError,
    MediaError,
    NotFoundError,
    StoreUnavailableError,
)
from sluicegate.http.errors import validated
from sluicegate.http.state import AppState
from sluicegate.inference.budget import BudgetReport
from sluicegate.inference.images import RequestImages
from sluicegate.models.served import ServedModel
from sluicegate.wire.requests import ChatCompletionRequest
from sluicegate.wire.response_body import ResponseEnvelope, identified
from sluicegate.wire.response_format import ResponsesFormat
from sluicegate.wire.responses import (
    Item,
    ResponsesRequest,
    chat_body,
    image_params,
    param_for,
)

logger = logging.getLogger(__name__)
router = APIRouter(prefix="/v1", tags=["responses"], route_class=LargeBodyRoute)


@router.post("/responses", response_model=None)
async def create_response(
    body: ResponsesRequest, request: Request, state: StateDep, key_id: KeyIdDep
) -> Response:
    body = body.opened(state.reasoning_seal)
    history = await _history(state, key_id, body.previous_response_id)
    chat = chat_request(chat_body(body, history))
    images = None
    if parts := chat.image_parts():
        places = image_params(history, body.input_items())
        named = list(zip(places, (image for _, image in parts), strict=True))
        images = RequestImages(named, state.media, part_type="input_image")

    async def prepare(model: ServedModel) -> Prepared:
        try:
            run = await model.service.prepare_chat(chat, images)
        except InvalidRequestError as exc:
            if not isinstance(exc, MediaError):  # an image's error names its part already
                exc.param = None if exc.param is None else param_for(exc.param)
            raise
        conversation = _used(history, body, run.budget)
        measured = _measured(state, conversation) if body.store else None
        echo = body.echo()
        if body.store and measured is None:
            echo["store"] = False  # the one way to say so that a stream and a body share
        seal = state.reasoning_seal if body.seals_reasoning else None
        fmt = ResponsesFormat(run.format, ResponseEnvelope(model.name, echo, seal=seal))

        async def answered() -> None:
            if measured is not None and fmt.final is not None:
                await _keep(state, key_id, StoredResponse(fmt.final, conversation, measured))

        return Prepared(dataclasses.replace(run, format=fmt), answered)

    return await respond(body.model, body.stream, request, state, prepare, images is not None)


@router.get("/responses/{response_id}", response_model=None)
async def get_response(response_id: str, state: StateDep, key_id: KeyIdDep) -> JSONResponse:
    stored = await state.responses.get(key_id, response_id)
    if stored is None:
        raise _not_found(response_id)
    return JSONResponse(stored.response)


@router.get("/responses/{response_id}/input_items", response_model=None)
async def list_input_items(
    response_id: str,
    state: StateDep,
    key_id: KeyIdDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
) -> JSONResponse:
    """The response's input items (the earlier conversation's included), a page at a time."""
    stored = await state.responses.get(key_id, response_id)
    if stored is None:
        raise _not_found(response_id)
    items = stored.items if order == "asc" else stored.items[::-1]
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise InvalidRequestError(f"No input item with id '{after}'.", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": len(items) > limit,
        }
    )


@router.delete("/responses/{response_id}", response_model=None)
async def delete_response(response_id: str, state: StateDep, key_id: KeyIdDep) -> JSONResponse:
    if not await state.responses.delete(key_id, response_id):
        raise _not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """The chat request, validated; what it refuses is a 400 naming the Responses parameter."""
    return validated(ChatCompletionRequest, body, param_for)


async def _history(state: AppState, key_id: str, previous_id: str | None) -> list[Item]:
    """The conversation `previous_response_id` continues (empty without one)."""
    if previous_id is None:
        return []
    previous = await state.responses.get(key_id, previous_id)
    if previous is None:
        raise InvalidRequestError(
            f"Previous response with id '{previous_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return previous.conversation()


def _used(history: list[Item], body: ResponsesRequest, budget: BudgetReport | None) -> list[Item]:
    """The conversation the prompt holds: all of it, or as truncation fitted it."""
    conversation = [*history, *identified(body.input_items())]
    if budget is None or budget.truncated is None:
        return conversation
    return fitted_items(conversation, budget.truncated, body.instructions is not None)


def _measured(state: AppState, conversation: list[Item]) -> bytes | None:
    """The conversation encoded, when the store can take a record holding it; else None
    (logged), and the response says `store: false`."""
    try:
        encoded = encode_items(conversation)
    except ValueError:  # not encodable (checked texts should make this impossible)
        logger.exception("a conversation could not be encoded; its response is not stored")
        return None
    if not state.responses.takes(len(encoded)):
        logger.warning(
            "a conversation of %d bytes is larger than the response store takes; "
            "answered with store: false",
            len(encoded),
        )
        return None
    return encoded


async def _keep(state: AppState, key_id: str, record: StoredResponse) -> None:
    try:
        kept = await state.responses.put(key_id, record)
    except StoreUnavailableError:
        logger.warning("response %s was answered but could not be stored", record.id)
        return
    except ValueError:  # not encodable (checked texts should make this impossible)
        logger.exception("response %s could not be encoded; not stored", record.id)
        return
    if not kept:
        logger.warning("response %s is larger than the store takes; not stored", record.id)


def _not_found(response_id: str) -> NotFoundError:
    return NotFoundError(f"No response found with id '{response_id}'.", param="response_id")

"""`LargeBodyRoute`: a POST is counted against its key's limits before its body is parsed,
and bodies of megabytes are parsed off the event loop.

Before anything proportional to the body is done (parsing, then templates, tokenizing, a
stored conversation, schemas), `Quotas.enter` counts the request against its key's requests
per minute and refuses it if the key holds its whole share of the engine: a key over its
limits costs one cheap check per request, whatever it sends.

FastAPI parses and validates a body inline, in C and Rust code that holds the GIL: for a body
of many small objects near the size limit that is a second or more during which no other
request (nor `/health`) is served. Above `LARGE_BODY_BYTES`, this route has the body parsed,
validated and made compact in a worker process first (`wire.compact`), and hands FastAPI the
compact form, whose validation costs little; a request of another API that runs as a chat
request (Anthropic's Messages) is converted there too, and handed to its endpoint as it comes
back. The worker's queue is bounded, in all and per key (`offload.ProcessOffload`): past it,
a 503 `overloaded`, or the key's 429.

A smaller JSON body whose endpoint takes only the body, the request and the app's state
(`_direct_call`: the inference routes) is validated by pydantic straight from its bytes and
handed to the endpoint: FastAPI's request handler (a JSON parse, then the dependency solver
and the validation of the parsed object) cost about 70 µs more per request, a twentieth of
an upstream stream's CPU. A body that fails validation goes through FastAPI's handler after
all, so every error reads as FastAPI renders it. Other bodies take FastAPI's own path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures.process import BrokenProcessPool
from typing import Any, ClassVar, get_type_hints

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from sluicegate.api.deps import get_state
from sluicegate.errors import ConcurrencyLimitError, OverloadedError
from sluicegate.http.asgi import api_key_id, mark_counted
from sluicegate.http.state import AppState, app_state
from sluicegate.observability import metrics
from sluicegate.offload import QueueFullError
from sluicegate.wire.compact import compact_body

LARGE_BODY_BYTES = 128 * 1024
"""Bodies above this are parsed in the worker process (about 20 ms of parsing inline)."""

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class LargeBodyRoute(APIRoute):
    engine_work: ClassVar[bool] = True
    """Whether the route's requests run on the engine (then a key holding its whole share
    is refused before its body is parsed)."""
    embeds: ClassVar[bool] = False
    """Whether they embed instead (then the key's embedding share is the one checked)."""

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        model = self._body_model()
        if model is None:
            return handle

        direct = self._direct_call(model)

        async def route(request: Request) -> Response:
            body = await request.body()
            state = app_state(request.scope)
            if state is None:
                return await handle(request)
            key_id = api_key_id(request.scope)
            await state.quotas.enter(key_id, self.engine_work, self.embeds)
            mark_counted(request.scope)
            if len(body) > LARGE_BODY_BYTES and _is_json(request):
                convert = direct is not None
                try:
                    compact = await state.processes.run(
                        compact_body, model, body, convert, owner=key_id
                    )
                except QueueFullError as full:
                    raise _queue_full(full) from None
                except BrokenProcessPool:
                    raise OverloadedError("The request body could not be parsed. Retry.") from None
                if compact.request is not None and direct is not None:
                    return await direct(compact.request, request, state)
                if compact.data is None:
                    raise RequestValidationError(compact.errors)
                # What Starlette's `Request.json()` returns from then on: FastAPI validates
                # this instead of parsing the body again.
                request._json = compact.data
            elif direct is not None and _is_json(request):
                try:
                    parsed = model.model_validate_json(body)
                except ValidationError:
                    return await handle(request)  # its error, as FastAPI renders it
                return await direct(parsed, request, state)
            return await handle(request)

        return route

    def _direct_call(
        self, model: type[BaseModel]
    ) -> Callable[[BaseModel, Request, AppState], Awaitable[Response]] | None:
        """The endpoint called with the validated body, the request and the app's state, when
        that is all it takes (`StateDep` its only dependency) and it answers a `Response`;
        else None."""
        dependant = self.dependant
        if (
            self.dependencies
            or dependant.path_params
            or dependant.query_params
            or dependant.header_params
            or dependant.cookie_params
            or dependant.response_param_name
            or dependant.background_tasks_param_name
            or any(d.call is not get_state for d in dependant.dependencies)
            or getattr(dependant.body_params[0].field_info, "embed", False)
            or not _answers_response(self.endpoint)
        ):
            return None
        endpoint = self.endpoint
        body_name = dependant.body_params[0].name
        request_name = dependant.request_param_name
        state_names = [d.name for d in dependant.dependencies if d.name is not None]

        async def call(body: BaseModel, request: Request, state: AppState) -> Response:
            arguments: dict[str, Any] = {body_name: body}
            if request_name is not None:
                arguments[request_name] = request
            for name in state_names:
                arguments[name] = state
            answer: Response = await endpoint(**arguments)
            return answer

        return call

    def _body_model(self) -> type[BaseModel] | None:
        params = self.dependant.body_params
        annotation = params[0].field_info.annotation if len(params) == 1 else None
        return (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else None
        )


class CountedRoute(LargeBodyRoute):
    """A `LargeBodyRoute` whose requests do no engine work (`/tokenize`): counted against
    the key's requests per minute, whatever its share."""

    engine_work = False


class EmbeddingRoute(LargeBodyRoute):
    """A `LargeBodyRoute` whose requests embed: a key holding its whole embedding share is
    refused before its body is parsed."""

    embeds = True


def _queue_full(full: QueueFullError) -> Exception:
    if full.mine:
        metrics.RATE_LIMITED.labels(limit="parse_queue").inc()
        return ConcurrencyLimitError(
            f"This API key has {full.waiting} large request bodies waiting to be parsed, as "
            "many as one key may. Retry when they are answered.",
            headers={"retry-after": "1"},
        )
    metrics.ADMISSION_REFUSED.labels("parse_queue").inc()
    return OverloadedError(
        f"The server is overloaded: {full.waiting} large request bodies wait to be parsed. "
        "Retry in 1 s.",
        headers={"retry-after": "1"},
    )


def _answers_response(endpoint: Callable[..., Any]) -> bool:
    answer = get_type_hints(endpoint).get("return")
    return isinstance(answer, type) and issubclass(answer, Response)


def _is_json(request: Request) -> bool:
    """Whether FastAPI would parse the body as JSON (it does for a JSON media type)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")

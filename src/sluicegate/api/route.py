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
compact form, whose validation costs little. Smaller bodies take FastAPI's own path. The
worker's queue is bounded, in all and per key (`offload.ProcessOffload`): past it, a 503
`overloaded`, or the key's 429.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from concurrent.futures.process import BrokenProcessPool
from typing import Any, ClassVar

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sluicegate.errors import ConcurrencyLimitError, OverloadedError
from sluicegate.http.asgi import api_key_id, mark_counted
from sluicegate.http.state import app_state
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

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        model = self._body_model()
        if model is None:
            return handle

        async def route(request: Request) -> Response:
            body = await request.body()
            state = app_state(request.scope)
            if state is None:
                return await handle(request)
            key_id = api_key_id(request.scope)
            await state.quotas.enter(key_id, self.engine_work)
            mark_counted(request.scope)
            if len(body) > LARGE_BODY_BYTES and _is_json(request):
                try:
                    compact = await state.processes.run(compact_body, model, body, owner=key_id)
                except QueueFullError as full:
                    raise _queue_full(full) from None
                except BrokenProcessPool:
                    raise OverloadedError("The request body could not be parsed. Retry.") from None
                if compact.data is None:
                    raise RequestValidationError(compact.errors)
                # What Starlette's `Request.json()` returns from then on: FastAPI validates
                # this instead of parsing the body again.
                request._json = compact.data
            return await handle(request)

        return route

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


def _is_json(request: Request) -> bool:
    """Whether FastAPI would parse the body as JSON (it does for a JSON media type)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")

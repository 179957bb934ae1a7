"""`LargeBodyRoute`: request bodies of megabytes are parsed off the event loop.

FastAPI parses and validates a body inline, in C and Rust code that holds the GIL: for a body
of many small objects near the size limit that is a second or more during which no other
request (nor `/health`) is served. Above `LARGE_BODY_BYTES`, this route has the body parsed,
validated and made compact in a worker process first (`wire.compact`), and hands FastAPI the
compact form, whose validation costs little. Smaller bodies take FastAPI's own path.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from sluicegate.errors import OverloadedError
from sluicegate.http.state import app_state
from sluicegate.wire.compact import compact_body

LARGE_BODY_BYTES = 128 * 1024
"""Bodies above this are parsed in the worker process (about 20 ms of parsing inline)."""

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class LargeBodyRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        model = self._body_model()
        if model is None:
            return handle

        async def route(request: Request) -> Response:
            body = await request.body()
            state = app_state(request.scope)
            if len(body) > LARGE_BODY_BYTES and state is not None and _is_json(request):
                try:
                    compact = await state.processes.run(compact_body, model, body)
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


def _is_json(request: Request) -> bool:
    """Whether FastAPI would parse the body as JSON (it does for a JSON media type)."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    return media_type == "application/json" or media_type.endswith("+json")

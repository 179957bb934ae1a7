"""Where errors become OpenAI's `{"error": {...}}` body (Anthropic's on its Messages API's
paths): one renderer per context.

Errors are raised anywhere as the `errors` tree; which renderer sends one depends only on
where the request is when it happens, and which envelope on the path (`rendered`):

- `install_error_handlers`: FastAPI's exception handlers, for errors raised in routes and
  dependencies, request validation (400) and Starlette's own 404 and 405;
- `send_error`: for pure-ASGI middleware, which answers before FastAPI is reached;
- `send_error_event`: for a stream that has started, where the status is already sent: the
  error goes as the last event, then `[DONE]` (as vLLM's server does).

Each counts the error in `sluicegate_errors_total`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException
from starlette.types import Scope, Send

from sluicegate.errors import GatewayError, InvalidRequestError, anthropic_error, error_for_status
from sluicegate.http.disconnect import ClientDisconnected
from sluicegate.observability.metrics import count_error
from sluicegate.paths import ANTHROPIC_PATHS
from sluicegate.wire.events import StreamWriter, error_events

logger = logging.getLogger(__name__)

# Parts pydantic adds to an error location that name a type, not a parameter.
_TYPE_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}


# ---- routes: FastAPI's handlers ------------------------------------------------------------


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnected, _client_disconnected)
    app.add_exception_handler(Exception, _unexpected_error)


def rendered(error: GatewayError, path: str) -> tuple[int, dict[str, Any]]:
    """The status and body of `error` on `path`: OpenAI's envelope, or Anthropic's on the
    Messages API's paths."""
    if path in ANTHROPIC_PATHS:
        return anthropic_error(error)
    return error.status_code, error.to_body()


def error_response(
    error: GatewayError, status_code: int | None = None, path: str = ""
) -> JSONResponse:
    count_error(error)
    status, body = rendered(error, path)
    if status_code is not None and path not in ANTHROPIC_PATHS:
        status = status_code
    return JSONResponse(body, status_code=status, headers=error.headers)


async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
    return error_response(exc, path=request.url.path)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first: dict[str, Any] = exc.errors()[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "invalid JSON")
        message = f"We could not parse the JSON body of your request: {detail}."
        return error_response(InvalidRequestError(message), path=request.url.path)
    param = validation_param(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {msg}."
    else:
        message = f"Invalid request body: {msg}."
    error = InvalidRequestError(message, param=param or None, code="invalid_value")
    return error_response(error, path=request.url.path)


M = TypeVar("M", bound=BaseModel)


def validated(model: type[M], body: dict[str, Any], rename: Callable[[str], str]) -> M:
    """`body` validated as `model`, for a request translated from another API's: what it
    refuses is a 400 naming the parameter as that API calls it (`rename`)."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        param = rename(validation_param(("body", *first["loc"])))
        msg = str(first["msg"]).removeprefix("Value error, ")
        raise InvalidRequestError(
            f"Invalid value for '{param}': {msg}.", param=param, code="invalid_value"
        ) from None


def validation_param(loc: tuple[Any, ...] | list[Any]) -> str:
    """`("body", "messages", 0, "content", "str")` -> `"messages.0.content"`."""
    parts = [str(p) for p in loc[1:] if not _is_type_part(p)] if loc else []
    return ".".join(parts)


def _is_type_part(part: Any) -> bool:
    return isinstance(part, str) and (
        part in _TYPE_PARTS or "[" in part or part.startswith("function-")
    )


async def _http_error(request: Request, exc: HTTPException) -> Response:
    if exc.status_code == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    else:
        message = str(exc.detail)
    error = error_for_status(exc.status_code, message)
    error.headers = dict(getattr(exc, "headers", None) or {})
    return error_response(error, exc.status_code, request.url.path)


async def _client_disconnected(request: Request, exc: Exception) -> Response:
    # Nobody is listening; 499 only shows up in access logs.
    return Response(status_code=499)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(GatewayError(), path=request.url.path)


# ---- pure-ASGI middleware --------------------------------------------------------------------


async def send_error(send: Send, error: GatewayError, scope: Scope | None = None) -> None:
    """Answer with `error` from pure-ASGI middleware, where FastAPI's handlers don't reach."""
    count_error(error)
    status, content = rendered(error, "" if scope is None else scope.get("path", ""))
    body = json.dumps(content).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---- a stream that has started -------------------------------------------------------------


async def send_error_event(
    send: Send, error: GatewayError, writer: StreamWriter | None = None
) -> None:
    """End a started stream with `error` as its writer renders it (by default, as chat
    streams end: the error as the last event, then `[DONE]`)."""
    count_error(error)
    payload = error_events(error) if writer is None else writer.error(error)
    await send({"type": "http.response.body", "body": payload, "more_body": True})

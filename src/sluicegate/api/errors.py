"""The one place where errors become OpenAI's `{"error": {...}}` body."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from sluicegate.errors import GatewayError, error_body
from sluicegate.observability.metrics import count_error, count_error_kind
from sluicegate.streaming import ClientDisconnected

logger = logging.getLogger(__name__)

# Parts pydantic adds to an error location that name a type, not a parameter.
_TYPE_PARTS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}
_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    413: "request_too_large",
}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(ClientDisconnected, _client_disconnected)
    app.add_exception_handler(Exception, _unexpected_error)


async def _gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
    count_error(exc)
    return JSONResponse(exc.to_body(), status_code=exc.status_code, headers=exc.headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    first: dict[str, Any] = exc.errors()[0]
    if first.get("type") == "json_invalid":
        detail = (first.get("ctx") or {}).get("error", "invalid JSON")
        message = f"We could not parse the JSON body of your request: {detail}."
        count_error_kind("invalid_request_error", None)
        return JSONResponse(error_body(message, "invalid_request_error"), status_code=400)
    param = validation_param(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    elif param:
        message = f"Invalid value for '{param}': {msg}."
    else:
        message = f"Invalid request body: {msg}."
    body = error_body(message, "invalid_request_error", param or None, "invalid_value")
    count_error_kind("invalid_request_error", "invalid_value")
    return JSONResponse(body, status_code=400)


def validation_param(loc: tuple[Any, ...] | list[Any]) -> str:
    """`("body", "messages", 0, "content", "str")` -> `"messages.0.content"`."""
    parts = [str(p) for p in loc[1:] if not _is_type_part(p)] if loc else []
    return ".".join(parts)


def _is_type_part(part: Any) -> bool:
    return isinstance(part, str) and (
        part in _TYPE_PARTS or "[" in part or part.startswith("function-")
    )


async def _http_error(request: Request, exc: HTTPException) -> Response:
    code = _HTTP_CODES.get(exc.status_code)
    if exc.status_code == 404:
        message = f"Unknown request URL: {request.method} {request.url.path}."
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed for {request.url.path}."
    else:
        message = str(exc.detail)
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    count_error_kind(kind, code)
    return JSONResponse(
        error_body(message, kind, None, code),
        status_code=exc.status_code,
        headers=getattr(exc, "headers", None),
    )


async def _client_disconnected(request: Request, exc: Exception) -> Response:
    # Nobody is listening; 499 only shows up in access logs.
    return Response(status_code=499)


async def _unexpected_error(request: Request, exc: Exception) -> JSONResponse:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    error = GatewayError()
    count_error(error)
    return JSONResponse(error.to_body(), status_code=error.status_code)

"""One error tree for the gateway, and its rendering as OpenAI's error body.

    GatewayError                      500 server_error
    ├── InvalidRequestError           400 invalid_request_error
    │   └── ContextLengthExceededError    code=context_length_exceeded
    ├── NotFoundError                 404 invalid_request_error
    │   └── ModelNotFoundError            code=model_not_found
    ├── MethodNotAllowedError         405 invalid_request_error
    └── EngineUnavailableError        503 service_unavailable_error

Services raise these; `api.errors` turns them (and FastAPI's own errors) into
`{"error": {"message", "type", "param", "code"}}` in one place. Foreign exceptions from the
engine are translated once, in the engine adapter.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None
    default_message: ClassVar[str] = "The server had an error while processing your request."

    def __init__(
        self, message: str | None = None, *, param: str | None = None, code: str | None = None
    ):
        message = message or self.default_message
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class NotFoundError(GatewayError):
    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class MethodNotAllowedError(GatewayError):
    status_code = 405
    error_type = "invalid_request_error"
    default_code = "method_not_allowed"


class EngineUnavailableError(GatewayError):
    status_code = 503
    error_type = "service_unavailable_error"
    default_code = "engine_unavailable"
    default_message = "The inference engine is not running."


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}

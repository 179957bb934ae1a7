"""One error tree for the gateway, and its rendering as OpenAI's error body.

    GatewayError                      500 server_error
    ├── InvalidRequestError           400 invalid_request_error
    │   ├── ContextLengthExceededError    code=context_length_exceeded
    │   └── MediaError                    code=invalid_image   (an image refused or unreadable)
    ├── AuthenticationError           401 invalid_request_error   code=invalid_api_key
    ├── PermissionDeniedError         403 invalid_request_error   code=permission_denied
    ├── NotFoundError                 404 invalid_request_error
    │   └── ModelNotFoundError            code=model_not_found
    ├── MethodNotAllowedError         405 invalid_request_error
    ├── RequestTimeoutError           408 invalid_request_error   code=request_timeout
    ├── ConflictError                 409 invalid_request_error   code=conflict
    ├── PayloadTooLargeError          413 invalid_request_error   code=request_too_large
    ├── UnprocessableError            422 invalid_request_error   (an upstream's refusal)
    ├── ConcurrencyLimitError         429 rate_limit_error        code=concurrency_limit_exceeded
    ├── RateLimitError                429 rate_limit_error        code=rate_limit_exceeded
    │   └── KeyRateLimitError             (the API key's own limits: no fallback helps)
    ├── BadGatewayError               502 upstream_error          code=upstream_error
    ├── EngineUnavailableError        503 service_unavailable_error
    │   ├── OverloadedError               code=overloaded
    │   ├── ShuttingDownError             code=shutting_down
    │   └── StoreUnavailableError         code=store_unavailable
    └── DeadlineExceededError         504 timeout_error           code=timeout

Services and middleware raise these. `http.errors` renders them as
`{"error": {"message", "type", "param", "code"}}`, in one place per context: FastAPI's
handlers (routes), `send_error` (pure-ASGI middleware) and `send_error_event` (a stream that
has started). Foreign exceptions from the engine are translated once, in the engine adapter;
HTTP statuses that Starlette raises itself (404, 405) through `error_for_status`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    status_code: ClassVar[int] = 500
    error_type: ClassVar[str] = "server_error"
    default_code: ClassVar[str | None] = None
    default_message: ClassVar[str] = "The server had an error while processing your request."

    def __init__(
        self,
        message: str | None = None,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        message = message or self.default_message
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}

    def to_body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequestError(GatewayError):
    status_code = 400
    error_type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class MediaError(InvalidRequestError):
    """An image the gateway refused to fetch, could not fetch, or could not read. `reason`
    says which (a metric's label: an address's kind, `too_large`, `timeout`, ...)."""

    default_code = "invalid_image"

    def __init__(self, reason: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.reason = reason
        self.index: int | None = None
        """Which of a request's images it is, when the part is not named yet (an engine's
        refusal of one of a prompt's images)."""

    def for_part(self, param: str) -> MediaError:
        """The same error, naming the request's part it came from."""
        return MediaError(self.reason, f"{param}: {self.message}", param=param)


class AuthenticationError(GatewayError):
    status_code = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"
    default_message = "Invalid or missing API key. Send it as 'Authorization: Bearer <key>'."


class PermissionDeniedError(GatewayError):
    status_code = 403
    error_type = "invalid_request_error"
    default_code = "permission_denied"
    default_message = "This API key may not call this endpoint."


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


class RequestTimeoutError(GatewayError):
    status_code = 408
    error_type = "invalid_request_error"
    default_code = "request_timeout"
    default_message = "The request body did not arrive in time."


class ConflictError(GatewayError):
    """The request cannot be done in the state the resource is in now (it may be later)."""

    status_code = 409
    error_type = "invalid_request_error"
    default_code = "conflict"


class PayloadTooLargeError(GatewayError):
    status_code = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class UnprocessableError(GatewayError):
    """An upstream's 422 (upstream mode), passed on with its status."""

    status_code = 422
    error_type = "invalid_request_error"


class ConcurrencyLimitError(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "concurrency_limit_exceeded"
    default_message = "Too many concurrent requests for this API key."


class RateLimitError(GatewayError):
    status_code = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class KeyRateLimitError(RateLimitError):
    """The API key's own limits refused: another model would refuse it as well."""


class BudgetExceededError(KeyRateLimitError):
    """The API key's budget for the period is used up (OpenAI's exhausted quota)."""

    error_type = "insufficient_quota"
    default_code = "insufficient_quota"


class BadGatewayError(GatewayError):
    """An upstream server failed (upstream mode), and no retry was left or allowed."""

    status_code = 502
    error_type = "upstream_error"
    default_code = "upstream_error"
    default_message = "The upstream server failed to answer."


class EngineUnavailableError(GatewayError):
    status_code = 503
    error_type = "service_unavailable_error"
    default_code = "engine_unavailable"
    default_message = "The inference engine is not running."


class OverloadedError(EngineUnavailableError):
    default_code = "overloaded"
    default_message = "The server is at capacity. Retry shortly."


class ShuttingDownError(EngineUnavailableError):
    default_code = "shutting_down"
    default_message = "The server is shutting down. Retry on another replica."


class StoreUnavailableError(EngineUnavailableError):
    default_code = "store_unavailable"
    default_message = "The response store is not answering. Retry shortly."


class DeadlineExceededError(GatewayError):
    status_code = 504
    error_type = "timeout_error"
    default_code = "timeout"
    default_message = "The request took longer than the server allows."


STATUS_ERRORS: dict[int, type[GatewayError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    405: MethodNotAllowedError,
    408: RequestTimeoutError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableError,
    429: RateLimitError,
    502: BadGatewayError,
    503: EngineUnavailableError,
    504: DeadlineExceededError,
}
"""The one table from HTTP status to error class, for statuses raised outside the tree."""


def error_for_status(status: int, message: str | None = None) -> GatewayError:
    """The tree's error for an HTTP status (500 `server_error` for one it does not name)."""
    return STATUS_ERRORS.get(status, GatewayError)(message)


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


ANTHROPIC_ERRORS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"),
    401: (401, "authentication_error"),
    403: (403, "permission_error"),
    404: (404, "not_found_error"),
    405: (405, "invalid_request_error"),
    408: (408, "timeout_error"),
    409: (400, "invalid_request_error"),
    413: (413, "request_too_large"),
    422: (400, "invalid_request_error"),
    429: (429, "rate_limit_error"),
    502: (500, "api_error"),
    503: (529, "overloaded_error"),
    504: (504, "timeout_error"),
}
"""Anthropic's status and error type for each of ours (`/v1/messages`): its API has no 502
or 503; an unavailable or overloaded server is its 529 `overloaded_error`, which its SDKs retry
like a 503."""


def anthropic_error(error: GatewayError) -> tuple[int, dict[str, Any]]:
    """The status and body of `error` in Anthropic's shape:
    `{"type": "error", "error": {"type", "message"}}`."""
    status, kind = ANTHROPIC_ERRORS.get(error.status_code, (500, "api_error"))
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}

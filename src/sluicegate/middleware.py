"""Pure-ASGI middleware: nothing here buffers bodies, so streams and disconnects pass through."""

from __future__ import annotations

import json
import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.errors import GatewayError
from sluicegate.observability.metrics import count_error

REQUEST_ID_HEADER = b"x-request-id"
# Client ids are echoed into headers and logs: accept only short, plain tokens.
_VALID_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class RequestIdMiddleware:
    """Accept `X-Request-Id` from the client or make one; put it on every response.

    The id is available to handlers as `request.state.request_id`.
    """

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        header = (REQUEST_ID_HEADER, request_id.encode())

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _client_request_id(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER:
            return value.decode() if _VALID_REQUEST_ID.fullmatch(value) else None
    return None


async def send_error(send: Send, error: GatewayError) -> None:
    """Answer with `error` from pure-ASGI middleware, where FastAPI's handlers don't reach."""
    count_error(error)
    body = json.dumps(error.to_body()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *((k.lower().encode(), v.encode()) for k, v in error.headers.items()),
    ]
    await send({"type": "http.response.start", "status": error.status_code, "headers": headers})
    await send({"type": "http.response.body", "body": body})

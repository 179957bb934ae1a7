"""`X-Request-Id`: accepted from the client or made, and put on every response; with several
workers (`SLUICEGATE_WORKERS`), `X-Sluicegate-Worker` too: which of them answered."""

from __future__ import annotations

import random
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.http.asgi import header

REQUEST_ID_HEADER = b"x-request-id"
WORKER_HEADER = b"x-sluicegate-worker"
# Client ids are echoed into headers and logs: accept only short, plain tokens.
_VALID_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


def new_request_id() -> str:
    """32 random hex digits, as `uuid4().hex` gives, without its system call for 16 bytes of
    the OS's randomness per request: an id must be unique, not unguessable (nothing is
    authorized by it), and the generator is seeded from the OS once."""
    return f"{random.getrandbits(128):032x}"


class RequestIdMiddleware:
    """Outermost, so even a 401 or 503 from the middleware below carries the id.

    The id is available to handlers as `request.state.request_id`."""

    def __init__(self, app: ASGIApp, worker: int | None = None):
        self.app = app
        self.worker_header = None if worker is None else (WORKER_HEADER, str(worker).encode())
        """The worker's index, on every response, when it is one of several."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _client_request_id(scope) or new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id
        added = [(REQUEST_ID_HEADER, request_id.encode())]
        if self.worker_header is not None:
            added.append(self.worker_header)

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *added]
            await send(message)

        await self.app(scope, receive, send_with_id)


def _client_request_id(scope: Scope) -> str | None:
    value = header(scope["headers"], REQUEST_ID_HEADER)
    if value is None or not _VALID_REQUEST_ID.fullmatch(value):
        return None
    return value.decode()

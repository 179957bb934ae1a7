"""Request-body limits, as pure-ASGI middleware: size and read time.

A body larger than `max_bytes` is refused with a 413 before it is read when the client
declares its length, and as soon as the count passes the limit otherwise (chunked uploads).
A body that does not finish arriving within `read_timeout` seconds gets a 408. Errors met
while the body is read are raised from `receive` as `errors.ReceiveError`, which FastAPI lets
through to its handlers untouched.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluicegate.errors import PayloadTooLargeError, RequestTimeoutError
from sluicegate.http.asgi import header
from sluicegate.http.errors import ReceiveError, send_error


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, read_timeout: float):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await send_error(send, PayloadTooLargeError(self._too_large_message()))
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout
        received = 0
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ReceiveError(RequestTimeoutError()) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ReceiveError(PayloadTooLargeError(self._too_large_message()))
                body_done = not message.get("more_body", False)
            return message

        await self.app(scope, limited_receive, send)

    def _too_large_message(self) -> str:
        return f"The request body is larger than the {self.max_bytes} bytes this server accepts."


def _content_length(scope: Scope) -> int | None:
    value = header(scope["headers"], b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None

"""Request-body limits, as pure-ASGI middleware: size and read time.

The whole body is read here, before the middleware below runs, so admission counts only
requests whose body has arrived: a slow upload holds no slot. The app below gets the body
back from `receive` as one message (`http.asgi.replaying`), so nothing reads it twice.

A body larger than `max_bytes` is refused with a 413 before it is read when the client
declares its length, and as soon as the count passes the limit otherwise (chunked uploads):
no more than `max_bytes` is ever held. A body that does not finish arriving within
`read_timeout` seconds gets a 408 (a body the server had whole before the app began,
`http.asgi.body_received`, is read without that timer). A client that leaves while sending
its body is counted as a 499 and reaches no route.

The admin endpoints (`paths.is_admin_path`) take small bodies: theirs are held to
`admin_max_bytes` (tens of KiB) the same way.
"""

from __future__ import annotations

import asyncio

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sluicegate.errors import GatewayError, PayloadTooLargeError, RequestTimeoutError
from sluicegate.http.asgi import body_received, header, replaying
from sluicegate.http.errors import send_error
from sluicegate.http.telemetry import CLIENT_CLOSED
from sluicegate.paths import is_admin_path


class BodyLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        read_timeout: float,
        admin_max_bytes: int | None = None,
    ):
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout = read_timeout
        self.admin_max_bytes = max_bytes if admin_max_bytes is None else admin_max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.admin_max_bytes if is_admin_path(scope.get("path", "")) else self.max_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await send_error(send, PayloadTooLargeError(_too_large_message(limit)), scope)
            return
        try:
            if body_received(scope):
                body = await _take(receive, limit)
            else:
                async with asyncio.timeout(self.read_timeout):
                    body = await _take(receive, limit)
        except TimeoutError:
            await send_error(send, RequestTimeoutError(), scope)
            return
        except GatewayError as exc:
            await send_error(send, exc, scope)
            return
        if body is None:
            # The client left: nobody reads this, but the access log and metrics count it.
            await Response(status_code=CLIENT_CLOSED)(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)


async def _take(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None if the client left before it was complete."""
    chunks: list[bytes] = []
    received = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        received += len(chunk)
        if received > limit:
            raise PayloadTooLargeError(_too_large_message(limit))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large_message(limit: int) -> str:
    return f"The request body is larger than the {limit} bytes this server accepts."


def _content_length(scope: Scope) -> int | None:
    value = header(scope["headers"], b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None

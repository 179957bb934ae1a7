"""Server-sent events and client disconnects.

- `sse_event` frames one JSON event; `SSE_DONE` closes every stream.
- `EventStreamResponse` sends events as they come. It watches the connection while it
  streams: when the client leaves, the event source is cancelled, which closes the engine
  generator and aborts the request in the engine.
- An error raised after the first byte cannot change the status any more; it is sent as an
  OpenAI error event, followed by `[DONE]`, and the stream ends (vLLM's server does the same).
- `until_disconnect` gives non-streamed requests the same abort-on-disconnect behaviour.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Mapping
from typing import Any, TypeVar

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluicegate.errors import GatewayError, error_body

logger = logging.getLogger(__name__)

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


def sse_event(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


async def wait_for_disconnect(receive: Receive) -> None:
    """Return when the server reports the client gone (after the body was read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await `work`, cancelling it and raising `ClientDisconnected` if the client leaves first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientDisconnected()


class EventStreamResponse(Response):
    """`text/event-stream` response over an async iterator of framed events."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        first: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ):
        # Like Starlette's StreamingResponse: no body attribute, so no Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})
        self._events = events
        self._first = first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            await until_disconnect(receive, self._pump(send))
        except ClientDisconnected:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> None:
        async with contextlib.aclosing(self._events) as events:
            if self._first:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            try:
                async for event in events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
            except GatewayError as exc:
                await send_error_event(send, exc.to_body())
                return
            except Exception:
                logger.exception("stream failed after the first byte")
                body = error_body("The server failed while streaming.", "server_error")
                await send_error_event(send, body)
                return
        await send({"type": "http.response.body", "body": SSE_DONE, "more_body": True})


async def send_error_event(send: Send, body: Mapping[str, Any]) -> None:
    payload = sse_event(body) + SSE_DONE
    await send({"type": "http.response.body", "body": payload, "more_body": True})


async def open_event_stream(
    receive: Receive, events: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None
) -> EventStreamResponse:
    """Wait for the first event before committing to a 200.

    Errors that happen before any output (engine down, input refused by the engine) thus
    still get their real HTTP status instead of an error event.
    """
    try:
        first = await until_disconnect(receive, anext(events))
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await events.aclose()
        raise
    return EventStreamResponse(events, first=first, headers=headers)

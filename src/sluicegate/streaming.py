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

from sluicegate.errors import DeadlineExceededError, GatewayError
from sluicegate.observability.metrics import count_error

logger = logging.getLogger(__name__)

T = TypeVar("T")

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_STALLED = "The stream went past its time limit (request_timeout or stream_stall_timeout)."


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


async def until_disconnect(
    receive: Receive, work: Awaitable[T], time_limit: float | None = None
) -> T:
    """Await `work`. If the client leaves first, cancel it and raise `ClientDisconnected`;
    if `time_limit` seconds pass first, cancel it and raise `DeadlineExceededError`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), timeout=time_limit, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    timed_out = not watcher.done()
    watcher.cancel()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    if timed_out:
        raise DeadlineExceededError()
    raise ClientDisconnected()


class EventStreamResponse(Response):
    """`text/event-stream` response over an async iterator of framed events."""

    media_type = "text/event-stream"

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        first: bytes = b"",
        headers: Mapping[str, str] | None = None,
        deadline: float | None = None,
        stall_timeout: float | None = None,
    ):
        """`deadline` is an event-loop time by which the stream must end; `stall_timeout` the
        longest wait for the next event. Either ends the stream with an error event, which
        closes the source and aborts the engine request."""
        # Like Starlette's StreamingResponse: no body attribute, so no Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})
        self._events = events
        self._first = first
        self._deadline = deadline
        self._stall_timeout = stall_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        try:
            await until_disconnect(receive, self._pump(send))
        except ClientDisconnected:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        async with contextlib.aclosing(self._events) as events:
            if self._first:
                await send({"type": "http.response.body", "body": self._first, "more_body": True})
            try:
                async with asyncio.timeout(None) as limit:
                    while True:
                        limit.reschedule(
                            next_deadline(loop.time(), self._deadline, self._stall_timeout)
                        )
                        try:
                            event = await anext(events)
                        except StopAsyncIteration:
                            break
                        await send({"type": "http.response.body", "body": event, "more_body": True})
            except TimeoutError:
                await send_error_event(send, DeadlineExceededError(_STALLED))
                return
            except GatewayError as exc:
                await send_error_event(send, exc)
                return
            except Exception:
                logger.exception("stream failed after the first byte")
                await send_error_event(send, GatewayError())
                return
        await send({"type": "http.response.body", "body": SSE_DONE, "more_body": True})


def next_deadline(now: float, deadline: float | None, stall_timeout: float | None) -> float | None:
    """The loop time by which the next event must arrive, or None for no limit."""
    candidates = [
        t
        for t in (deadline, None if stall_timeout is None else now + stall_timeout)
        if t is not None
    ]
    return min(candidates) if candidates else None


async def send_error_event(send: Send, error: GatewayError) -> None:
    """End a started stream with `error` as its last event; counted like any error answer."""
    count_error(error)
    payload = sse_event(error.to_body()) + SSE_DONE
    await send({"type": "http.response.body", "body": payload, "more_body": True})


async def open_event_stream(
    receive: Receive,
    events: AsyncGenerator[bytes, None],
    headers: Mapping[str, str] | None = None,
    time_limit: float | None = None,
    stall_limit: float | None = None,
) -> EventStreamResponse:
    """Wait for the first event before committing to a 200.

    Errors that happen before any output (engine down, input refused by the engine, the
    first token taking longer than the limits) thus still get their real HTTP status.
    """
    loop = asyncio.get_running_loop()
    deadline = None if time_limit is None else loop.time() + time_limit
    wait = next_deadline(loop.time(), deadline, stall_limit)
    try:
        first = await until_disconnect(
            receive, anext(events), None if wait is None else wait - loop.time()
        )
    except StopAsyncIteration:
        first = b""
    except BaseException:
        await events.aclose()
        raise
    return EventStreamResponse(
        events, first=first, headers=headers, deadline=deadline, stall_timeout=stall_limit
    )

"""The `text/event-stream` response.

- `open_event_stream` waits for the first event before committing to a 200, so errors that
  happen before any output (engine down, input refused, the first token taking longer than
  the limits) still get their real HTTP status.
- `EventStreamResponse` sends events as they come. It watches the connection while it
  streams: when the client leaves, the event source is cancelled, which closes the engine
  generator and aborts the request in the engine.
- An error raised after the first byte cannot change the status any more; it is sent as an
  OpenAI error event, followed by `[DONE]`, and the stream ends (`errors.send_error_event`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Mapping

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from sluicegate.errors import DeadlineExceededError, GatewayError
from sluicegate.http.disconnect import ClientDisconnected, until_disconnect
from sluicegate.http.errors import send_error_event
from sluicegate.wire.events import SSE_DONE, SSE_HEADERS

logger = logging.getLogger(__name__)

_STALLED = "The stream went past its time limit (request_timeout or stream_stall_timeout)."


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


async def open_event_stream(
    receive: Receive,
    events: AsyncGenerator[bytes, None],
    headers: Mapping[str, str] | None = None,
    deadline: float | None = None,
    stall_limit: float | None = None,
) -> EventStreamResponse:
    """The response for `events`, once the first of them has come (see the module doc).

    `deadline` is the event-loop time by which the whole stream must end."""
    loop = asyncio.get_running_loop()
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

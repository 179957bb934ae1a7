"""The `text/event-stream` response.

- `open_event_stream` waits for the first event before committing to a 200, so errors that
  happen before any output (engine down, input refused, the first token taking longer than
  the limits) still get their real HTTP status.
- `EventStreamResponse` sends events as they come. It watches the connection while it
  streams: when the client leaves, the event source is cancelled, which closes the engine
  generator and aborts the request in the engine.
- A stream with a keep-alive (`Keepalive`: Anthropic's Messages API) whose first event takes
  longer than `after` begins anyway: its opening events (`message_start`), then a ping every
  `every` seconds until the first event; errors from then on are error events. The first
  event's own time limit still holds.
- An error raised after the first byte cannot change the status any more; it is sent as an
  OpenAI error event, followed by `[DONE]`, and the stream ends (`errors.send_error_event`);
  a stream with a writer of its own (`ending`: the Responses API's) ends as that renders it.
- The wait for the next event is bounded by `stall_timeout`; an empty event from the source
  (engine output that shows nothing: thoughts left out, text a tool parser holds) is progress
  that sends nothing, so a model thinking silently is not a stalled stream.
- Every `send` is bounded like the wait for an event (`stall_timeout`, `deadline`): a client
  that stops reading fills the socket buffers, and the server's `send` then blocks. The
  stream ends as if stalled: the event source is closed first (the engine request is
  aborted), then the error event gets `CLOSING_SEND_TIMEOUT` to go out, and if it cannot, the
  response is left unfinished, which makes the server close the connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from sluicegate.errors import DeadlineExceededError, GatewayError
from sluicegate.http.disconnect import (
    ClientDisconnected,
    until_disconnect,
    watch_disconnect,
)
from sluicegate.http.errors import send_error_event
from sluicegate.wire.events import SSE_DONE, SSE_HEADERS, StreamWriter

logger = logging.getLogger(__name__)

_STALLED = "The stream went past its time limit (request_timeout or stream_stall_timeout)."
CLOSING_SEND_TIMEOUT = 1.0
"""Seconds the last events may take to be written after a client stopped reading."""
_END: Message = {"type": "http.response.body", "body": b"", "more_body": False}


class SendStalled(Exception):
    """A `send` did not complete in time: the client is not reading."""


@dataclass(frozen=True, slots=True)
class Keepalive:
    """How a stream whose first event is slow begins anyway: `opening()`'s events after
    `after` seconds without one, then `ping` every `every` seconds until it comes."""

    opening: Callable[[], bytes]
    ping: bytes
    after: float
    every: float


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
        ending: StreamWriter | None = None,
        pending: asyncio.Future[bytes] | None = None,
        keepalive: Keepalive | None = None,
        first_by: float | None = None,
        watcher: asyncio.Future[None] | None = None,
    ):
        """`deadline` is an event-loop time by which the stream must end; `stall_timeout` the
        longest wait for the next event, and for each send. Either ends the stream with an
        error event, which closes the source and aborts the engine request. `ending` renders
        the stream's end (`[DONE]`, or the error events) when it is not a chat stream's.
        `pending`: the first event, still awaited (with `keepalive`, by `first_by`).
        `watcher`: the exchange's disconnect watcher (`watch_disconnect`), which the
        response takes over and ends with the stream."""
        # Like Starlette's StreamingResponse: no body attribute, so no Content-Length.
        self.status_code = 200
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})
        self._events = events
        self._first = first
        self._deadline = deadline
        self._stall_timeout = stall_timeout
        self._ending = ending
        self._started = False
        self._pending = pending
        self._keepalive = keepalive
        self._first_by = first_by
        self._watcher = watcher

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await until_disconnect(receive, self._stream(send), watcher=self._watcher)
        except ClientDisconnected:
            return
        finally:
            if self._watcher is not None:
                self._watcher.cancel()

    async def _stream(self, send: Send) -> None:
        closing: float | None
        try:
            error = await self._pump(send)
        except SendStalled:
            if not self._started:
                return  # the connection was stuck before this response began
            error, closing = DeadlineExceededError(_STALLED), CLOSING_SEND_TIMEOUT
        else:
            closing = self._stall_timeout
        # The event source is closed by now: a client that reads nothing holds no engine work,
        # only this bounded wait for the last bytes.
        try:
            async with asyncio.timeout(closing):
                if error is None:
                    done = SSE_DONE if self._ending is None else self._ending.done()
                    await send({"type": "http.response.body", "body": done, "more_body": False})
                else:
                    await send_error_event(send, error, self._ending)
                    await send(_END)
        except TimeoutError:
            logger.info("a stream's client stopped reading; dropping its connection")

    async def _pump(self, send: Send) -> GatewayError | None:
        """Send the events; the error that ended the stream early, or None at its end.
        Raises `SendStalled` when the client stopped reading."""
        watchdog = _Watchdog(self._deadline, self._stall_timeout)
        async with contextlib.aclosing(self._events) as events:
            try:
                start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                await watchdog.send(send, start)
                self._started = True
                if self._pending is not None:
                    first = await self._kept_alive(send, watchdog)
                    if first is None:
                        return None
                    self._first = first
                if self._first:
                    await watchdog.send(send, _event(self._first))
                while True:
                    try:
                        event = await anext(events)
                    except StopAsyncIteration:
                        return None
                    watchdog.progress()
                    if event:  # empty: engine output that shows nothing (hidden thoughts)
                        await watchdog.send(send, _event(event))
            except asyncio.CancelledError:
                if watchdog.expired():
                    if watchdog.sending:
                        raise SendStalled() from None
                    return DeadlineExceededError(_STALLED)
                raise
            except GatewayError as exc:
                return exc
            except SendStalled:
                raise
            except Exception:
                logger.exception("stream failed after the first byte")
                return GatewayError()
            finally:
                watchdog.close()
                if self._pending is not None and not self._pending.done():
                    # The source cannot be closed while its first event is being made.
                    self._pending.cancel()
                    await asyncio.wait({self._pending})

    async def _kept_alive(self, send: Send, watchdog: _Watchdog) -> bytes | None:
        """The first event, pinging while it is awaited; None when the source ended without
        one. Raises what making it raised, and `DeadlineExceededError` past its time limit."""
        pending, keepalive = self._pending, self._keepalive
        assert pending is not None and keepalive is not None
        loop = asyncio.get_running_loop()
        await watchdog.send(send, _event(keepalive.opening() + keepalive.ping))
        while True:
            wait = keepalive.every
            if self._first_by is not None:
                wait = min(wait, self._first_by - loop.time())
            if wait <= 0:
                raise DeadlineExceededError(_STALLED)
            done, _ = await asyncio.wait({pending}, timeout=wait)
            if done:
                try:
                    return pending.result()
                except StopAsyncIteration:
                    return None
            await watchdog.send(send, _event(keepalive.ping))


class _Watchdog:
    """The stream's time limits, with one timer per stream rather than one per event.

    Each event and each send is a step of progress. The timer fires at the earliest moment a
    limit could be passed (the next event's or send's `stall_timeout` after the last
    progress, or the `deadline`); if progress came since, it is set again for later, and if
    not, the streaming task is cancelled. `expired` then tells that cancellation from any
    other (the client leaving, the server stopping), as `asyncio.timeout` does."""

    def __init__(self, deadline: float | None, stall_timeout: float | None):
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._deadline = deadline
        self._stall_timeout = stall_timeout
        self._cancelling = self._task.cancelling() if self._task else 0
        self._last = self._loop.time()
        self._fired = False
        self._handle: asyncio.TimerHandle | None = None
        self.sending = False
        self._arm()

    def progress(self) -> None:
        self._last = self._loop.time()

    async def send(self, send: Send, message: Message) -> None:
        self.sending = True
        await send(message)
        self.sending = False
        self._last = self._loop.time()

    def expired(self) -> bool:
        """Whether this watchdog cancelled the task (and that is the only cancellation)."""
        if not self._fired or self._task is None:
            return False
        return self._task.uncancel() <= self._cancelling

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        when = next_deadline(self._last, self._deadline, self._stall_timeout)
        if when is not None and self._task is not None:
            self._handle = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        when = next_deadline(self._last, self._deadline, self._stall_timeout)
        if when is not None and when > self._loop.time():  # progress came since: later
            self._arm()
            return
        self._handle = None
        self._fired = True
        assert self._task is not None
        self._task.cancel()


def _event(body: bytes) -> Message:
    return {"type": "http.response.body", "body": body, "more_body": True}


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
    ending: StreamWriter | None = None,
    keepalive: Keepalive | None = None,
) -> EventStreamResponse:
    """The response for `events`, once the first of them has come, or with `keepalive`, once
    it has been awaited for `keepalive.after` seconds (see the module doc).

    `deadline` is the event-loop time by which the whole stream must end."""
    loop = asyncio.get_running_loop()
    wait = next_deadline(loop.time(), deadline, stall_limit)
    if keepalive is not None:
        return await _open_kept_alive(
            receive, events, headers, deadline, stall_limit, ending, keepalive, wait
        )
    # One watcher for the exchange: it watches for the first event, then for the stream.
    watcher = watch_disconnect(receive)
    try:
        first = await until_disconnect(
            receive, anext(events), None if wait is None else wait - loop.time(), watcher
        )
    except StopAsyncIteration:
        first = b""
    except BaseException:
        watcher.cancel()
        await events.aclose()
        raise
    return EventStreamResponse(
        events,
        first=first,
        headers=headers,
        deadline=deadline,
        stall_timeout=stall_limit,
        ending=ending,
        watcher=watcher,
    )


async def _open_kept_alive(
    receive: Receive,
    events: AsyncGenerator[bytes, None],
    headers: Mapping[str, str] | None,
    deadline: float | None,
    stall_limit: float | None,
    ending: StreamWriter | None,
    keepalive: Keepalive,
    wait: float | None,
) -> EventStreamResponse:
    """`open_event_stream` with a keep-alive: the first event awaited for `keepalive.after`
    seconds at most before the response begins without it."""
    loop = asyncio.get_running_loop()
    pending: asyncio.Future[bytes] = asyncio.ensure_future(anext(events))
    limit = keepalive.after if wait is None else min(keepalive.after, wait - loop.time())
    # One watcher for the exchange, as in `open_event_stream`.
    watcher = watch_disconnect(receive)
    try:
        done = await _settled(watcher, pending, limit)
    except BaseException:
        watcher.cancel()
        await events.aclose()
        raise
    if not done and (wait is None or loop.time() < wait):
        return EventStreamResponse(
            events,
            headers=headers,
            deadline=deadline,
            stall_timeout=stall_limit,
            ending=ending,
            pending=pending,
            keepalive=keepalive,
            first_by=wait,
            watcher=watcher,
        )
    try:
        if not done:
            raise DeadlineExceededError()
        first = pending.result()
    except StopAsyncIteration:
        first = b""
    except BaseException:
        watcher.cancel()
        await events.aclose()
        raise
    return EventStreamResponse(
        events,
        first=first,
        headers=headers,
        deadline=deadline,
        stall_timeout=stall_limit,
        ending=ending,
        watcher=watcher,
    )


async def _settled(
    watcher: asyncio.Future[None], pending: asyncio.Future[bytes], seconds: float
) -> bool:
    """Whether `pending` is done within `seconds`. If the client leaves first (`watcher` is
    done), it is cancelled (and awaited) and `ClientDisconnected` raised; past `seconds`, it
    goes on."""
    try:
        await asyncio.wait(
            (pending, watcher), timeout=max(0.0, seconds), return_when=asyncio.FIRST_COMPLETED
        )
    except asyncio.CancelledError:
        pending.cancel()
        await asyncio.wait({pending})
        raise
    if pending.done():
        return True
    if watcher.done() and not watcher.cancelled():
        pending.cancel()
        await asyncio.wait({pending})
        raise ClientDisconnected()
    return False

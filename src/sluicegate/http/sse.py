"""The `text/event-stream` response.

- `open_event_stream` waits for the first event before committing to a 200, so errors that
  happen before any output (engine down, input refused, the first token taking longer than
  the limits) still get their real HTTP status.
- `EventStreamResponse` sends events as they come. It watches the connection while it
  streams: when the client leaves, the event source is cancelled, which closes the engine
  generator and aborts the request in the engine.
- A stream with a keep-alive (`Keepalive`: every API's) says it is alive while it has nothing
  to send, for the proxies in between that cut idle connections. Mid-stream, `ping` (an SSE
  comment, or Anthropic's `ping` event) whenever `every` seconds passed without a send. One
  whose first event takes longer than `after` begins anyway: its opening events (Anthropic's
  `message_start`; none on the OpenAI APIs), then a ping every `after` seconds until the first
  event; errors from then on are error events. The first event's own time limit still holds.
  A ping is not progress: a source that stays silent still ends the stream as stalled.
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
  response is left unfinished, which makes the server close the connection. A ping's send is
  bounded so too.
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


def _nothing() -> bytes:
    return b""


@dataclass(frozen=True, slots=True)
class Keepalive:
    """What a stream sends while it has nothing to send: `ping`, once `every` seconds passed
    without a send. Before its first event, it begins anyway after `after` seconds without
    one: `opening()`'s events, then `ping` every `after` seconds until the event comes."""

    ping: bytes
    every: float
    after: float
    opening: Callable[[], bytes] = _nothing


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
        `keepalive`: what to send while the stream is silent (see `Keepalive`).
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
        # Kept alive from the start, unless the first event is still awaited (it pings itself).
        keepalive = self._keepalive if self._pending is None else None
        watchdog = _Watchdog(self._deadline, self._stall_timeout, send, keepalive)
        async with contextlib.aclosing(self._events) as events:
            try:
                start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                await watchdog.send(start)
                self._started = True
                if self._pending is not None:
                    first = await self._kept_alive(watchdog)
                    if first is None:
                        return None
                    self._first = first
                    watchdog.keep_alive(self._keepalive)
                if self._first:
                    await watchdog.send(_event(self._first))
                while True:
                    try:
                        event = await anext(events)
                    except StopAsyncIteration:
                        return None
                    watchdog.progress()
                    if event:  # empty: engine output that shows nothing (hidden thoughts)
                        await watchdog.send(_event(event))
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
                await watchdog.close()
                if self._pending is not None and not self._pending.done():
                    # The source cannot be closed while its first event is being made.
                    self._pending.cancel()
                    await asyncio.wait({self._pending})

    async def _kept_alive(self, watchdog: _Watchdog) -> bytes | None:
        """The first event, pinging while it is awaited; None when the source ended without
        one. Raises what making it raised, and `DeadlineExceededError` past its time limit."""
        pending, keepalive = self._pending, self._keepalive
        assert pending is not None and keepalive is not None
        loop = asyncio.get_running_loop()
        await watchdog.send(_event(keepalive.opening() + keepalive.ping))
        while True:
            wait = keepalive.after
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
            await watchdog.ping(_event(keepalive.ping))


class _Watchdog:
    """The stream's time limits and its keep-alive, with one timer per stream rather than
    one per event.

    Each event and each send of one is a step of progress. The timer fires at the earliest
    moment a limit could be passed (the next event's or send's `stall_timeout` after the last
    progress, or the `deadline`) or a keep-alive could be due (`every` seconds after the last
    send); if progress or a send came since, it is set again for later. Past a limit, the
    streaming task is cancelled; `expired` then tells that cancellation from any other (the
    client leaving, the server stopping), as `asyncio.timeout` does. A keep-alive that is due
    while the stream waits for its source is sent by a task of its own, which an event to send
    replaces if the socket has not taken the ping yet (one writer at a time); it is bounded
    like any send, and it is not progress."""

    def __init__(
        self,
        deadline: float | None,
        stall_timeout: float | None,
        send: Send,
        keepalive: Keepalive | None = None,
    ):
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._deadline = deadline
        self._stall_timeout = stall_timeout
        self._send = send
        self._cancelling = self._task.cancelling() if self._task else 0
        self._last = self._sent = self._loop.time()
        self._fired = False
        self._handle: asyncio.TimerHandle | None = None
        self._ping = None if keepalive is None else keepalive.ping
        self._every = 0.0 if keepalive is None else keepalive.every
        self._pinging: asyncio.Task[None] | None = None
        self.sending = False
        self._arm()

    def keep_alive(self, keepalive: Keepalive | None) -> None:
        """From now on, send its ping whenever its `every` seconds pass without a send."""
        if keepalive is None:
            return
        self._ping, self._every = keepalive.ping, keepalive.every
        if self._handle is not None:
            self._handle.cancel()
        self._arm()

    def progress(self) -> None:
        self._last = self._loop.time()

    async def send(self, message: Message) -> None:
        if self._pinging is not None:
            self._stop_pinging()
        self.sending = True
        await self._send(message)
        self.sending = False
        self._last = self._sent = self._loop.time()

    async def ping(self, message: Message) -> None:
        """A send that is not progress (a keep-alive), bounded all the same."""
        self.sending = True
        await self._send(message)
        self.sending = False
        self._sent = self._loop.time()

    def expired(self) -> bool:
        """Whether this watchdog cancelled the task (and that is the only cancellation)."""
        if not self._fired or self._task is None:
            return False
        return self._task.uncancel() <= self._cancelling

    async def close(self) -> None:
        """No more limits or keep-alives; one still being written is given up."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._ping = None
        pinging, self._pinging = self._pinging, None
        if pinging is not None:
            pinging.cancel()
            await asyncio.wait({pinging})
            if not pinging.cancelled():
                pinging.exception()  # retrieved: the stream ends anyway

    def _arm(self) -> None:
        when = next_deadline(self._last, self._deadline, self._stall_timeout)
        if self._ping is not None:
            due = self._sent + self._every
            when = due if when is None else min(when, due)
        if when is not None and self._task is not None:
            self._handle = self._loop.call_at(when, self._check)

    def _check(self) -> None:
        now = self._loop.time()
        when = next_deadline(self._last, self._deadline, self._stall_timeout)
        if when is not None and when <= now:
            self._handle = None
            self._fired = True
            assert self._task is not None
            self._task.cancel()
            return
        if self._ping is not None and self._sent + self._every <= now:
            self._sent = now  # the next one is due `every` from now, whether this one goes
            if self._pinging is None and not self.sending:
                self._pinging = self._loop.create_task(self._keep_alive())
        self._arm()  # progress or a send came since, or the next keep-alive: later

    async def _keep_alive(self) -> None:
        assert self._ping is not None
        self.sending = True
        await self._send(_event(self._ping))  # on failure, kept for `_stop_pinging` to raise
        self.sending = False
        self._pinging = None

    def _stop_pinging(self) -> None:
        """Give up the keep-alive in flight: not written yet (a server writes a message
        whole, once the socket has room), so an event can go instead. Raises what its send
        raised, if it failed."""
        pinging, self._pinging = self._pinging, None
        assert pinging is not None
        if not pinging.done():
            pinging.cancel()
        elif not pinging.cancelled() and (failure := pinging.exception()) is not None:
            raise failure


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
            # Closed with its generator, which cannot be closed while it makes the event.
            pending.cancel()
            await asyncio.wait({pending})
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
        keepalive=keepalive,
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

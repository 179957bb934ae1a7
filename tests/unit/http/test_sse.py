"""The event stream against a client that stops reading (every send is bounded), and the
watch on its client's connection (one for the exchange)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator

from starlette.types import Message

from sluicegate.http.sse import (
    CLOSING_SEND_TIMEOUT,
    EventStreamResponse,
    Keepalive,
    open_event_stream,
)

STALL = 0.3


class Source:
    """Endless events, one every 10 ms; notes when it is closed (the engine abort)."""

    def __init__(self) -> None:
        self.closed = asyncio.Event()

    async def events(self) -> AsyncGenerator[bytes, None]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield b'data: {"x": 1}\n\n'
        finally:
            self.closed.set()


class Socket:
    """A `send` whose buffer fills after `room` messages; `stuck` sends then never return
    (the client reads nothing more), the ones after succeed."""

    def __init__(self, room: int, stuck: int | None = None) -> None:
        self.room = room
        self.stuck = stuck
        self.sent: list[Message] = []
        self.blocked = 0

    async def send(self, message: Message) -> None:
        if len(self.sent) >= self.room and (self.stuck is None or self.blocked < self.stuck):
            self.blocked += 1
            await asyncio.Event().wait()
        self.sent.append(message)


async def never_disconnects() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def stream_into(socket: Socket, stall: float = STALL) -> tuple[Source, float]:
    source = Source()
    response = EventStreamResponse(source.events(), stall_timeout=stall)
    started = time.monotonic()
    await asyncio.wait_for(response({"type": "http"}, never_disconnects, socket.send), 60)
    return source, time.monotonic() - started


async def test_a_client_that_reads_nothing_more_releases_the_stream_in_bounded_time() -> None:
    socket = Socket(room=5)
    source, took = await stream_into(socket)
    assert source.closed.is_set(), "the event source (the engine request) was closed"
    # The stall limit and the closing send's own, then released: 5 times that leaves room
    # for a machine with both cores busy (a stream held for good is what this catches).
    alone = 5 * 0.01 + STALL + CLOSING_SEND_TIMEOUT
    assert took < 5 * alone, f"released after {took:.2f} s ({alone:.2f} s alone)"
    # The error event could not be written either; the response is left unfinished, so the
    # server drops the connection.
    assert len(socket.sent) == 5
    assert all(m.get("more_body", True) for m in socket.sent)


async def test_the_error_event_goes_out_when_the_client_reads_again() -> None:
    socket = Socket(room=5, stuck=1)
    # A stall limit of 2 s: under 0.3 s, a loaded machine holding this process up between
    # two of the source's events (10 ms apart) fired the limit on the source, before the
    # send this test is about was stuck (it failed so once, at a load of 15 on two cores).
    source, _ = await stream_into(socket, stall=2.0)
    assert source.closed.is_set()
    tail = b"".join(m.get("body", b"") for m in socket.sent[5:])
    events = [line[6:] for line in tail.decode().splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["error"]["code"] == "timeout"
    assert events[-1] == "[DONE]"
    assert socket.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


class Finite:
    """`count` events `every` seconds apart, then a pause of `pause` seconds, then the end."""

    def __init__(self, count: int, every: float, pause: float = 0.0) -> None:
        self.count, self.every, self.pause = count, every, pause
        self.closed = asyncio.Event()

    async def events(self) -> AsyncGenerator[bytes, None]:
        try:
            for _ in range(self.count):
                await asyncio.sleep(self.every)
                yield b'data: {"x": 1}\n\n'
            await asyncio.sleep(self.pause)
        finally:
            self.closed.set()


def data_lines(socket: Socket) -> list[str]:
    text = b"".join(m.get("body", b"") for m in socket.sent).decode()
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def run_stream(source: Finite, **limits: float) -> Socket:
    socket = Socket(room=10_000)
    response = EventStreamResponse(source.events(), **limits)  # type: ignore[arg-type]
    await asyncio.wait_for(response({"type": "http"}, never_disconnects, socket.send), 60)
    return socket


async def test_a_stream_that_keeps_coming_outlives_many_stall_limits() -> None:
    # 400 events 5 ms apart: 2 s of a stream under a 0.5 s stall limit, which one timer
    # per stream must re-arm after every event rather than fire. The limit is 100 times the
    # gap between events: a loaded machine that holds this process up for a moment must not
    # look like a stalled source.
    source = Finite(count=400, every=0.005)
    socket = await run_stream(source, stall_timeout=0.5)
    events = data_lines(socket)
    assert len(events) == 401 and events[-1] == "[DONE]", events[-3:]


async def test_an_event_source_that_stalls_ends_with_a_timeout_error_and_is_closed() -> None:
    source = Finite(count=5, every=0.01, pause=30.0)
    started = time.monotonic()
    socket = await run_stream(source, stall_timeout=0.2)
    took = time.monotonic() - started
    # Ended by the 0.2 s stall limit (0.25 s alone), not by the source's 30 s pause: the
    # bound is a third of the pause, and 40 times what it takes alone.
    assert took < 10.0, f"the stream ended after {took:.2f} s, not at its 0.2 s stall limit"
    assert source.closed.is_set()
    events = data_lines(socket)
    assert len(events) == 7
    assert json.loads(events[5])["error"]["code"] == "timeout"
    assert events[-1] == "[DONE]"


async def test_the_deadline_ends_a_stream_whose_events_keep_coming() -> None:
    source = Finite(count=4000, every=0.01)
    deadline = asyncio.get_running_loop().time() + 0.3
    started = time.monotonic()
    socket = await run_stream(source, stall_timeout=30.0, deadline=deadline)
    took = time.monotonic() - started
    # Ended by the 0.3 s deadline, not by the 40 s of events or the 30 s stall limit: the
    # bound is a third of the stall limit, and 30 times what it takes alone.
    assert took < 10.0, f"the stream ended after {took:.2f} s, not at its 0.3 s deadline"
    assert source.closed.is_set()
    events = data_lines(socket)
    # Some events, then the timeout; events are at least 10 ms apart, so at most 1000 in 10 s.
    assert 2 < len(events) < 1000, len(events)
    assert json.loads(events[-2])["error"]["code"] == "timeout"


async def test_a_cancelled_stream_is_cancelled_not_timed_out() -> None:
    # The server cancelling the stream (the client gone) stays a cancellation, with the
    # stall limit armed. Cancelled once the event is out (a condition, not a sleep racing a
    # 0.1 s margin to the limit, which a loaded machine lost): the limit is 30 s away.
    source = Finite(count=1, every=0.01, pause=60.0)
    socket = Socket(room=10_000)
    response = EventStreamResponse(source.events(), stall_timeout=30.0)
    task = asyncio.ensure_future(response({"type": "http"}, never_disconnects, socket.send))
    deadline = time.monotonic() + 10
    while not data_lines(socket):
        assert time.monotonic() < deadline, "the stream's first event never went out"
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.wait([task], timeout=5)
    assert task.cancelled()
    assert source.closed.is_set()
    assert "[DONE]" not in data_lines(socket)


class Connection:
    """An ASGI `receive` whose client leaves when `leave` is set; counts the calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.leave = asyncio.Event()

    async def receive(self) -> Message:
        self.calls += 1
        await self.leave.wait()
        return {"type": "http.disconnect"}


async def test_one_watcher_watches_for_the_first_event_and_the_stream() -> None:
    connection = Connection()
    source = Finite(count=3, every=0.01)
    response = await open_event_stream(connection.receive, source.events(), stall_limit=5.0)
    socket = Socket(room=10_000)
    await asyncio.wait_for(response({"type": "http"}, connection.receive, socket.send), 60)
    assert len(data_lines(socket)) == 4  # three events and [DONE]
    # One pending `receive` for the whole exchange: the first wait's watcher went on to
    # watch the stream, instead of a second one being started.
    assert connection.calls == 1


async def test_a_client_gone_between_the_first_event_and_the_stream_ends_it() -> None:
    connection = Connection()
    source = Finite(count=1000, every=0.01)
    response = await open_event_stream(connection.receive, source.events(), stall_limit=5.0)
    connection.leave.set()
    # The watcher sees the client gone before the stream begins.
    deadline = time.monotonic() + 10
    while not response._watcher or not response._watcher.done():
        assert time.monotonic() < deadline, "the watcher never saw the client leave"
        await asyncio.sleep(0.01)
    socket = Socket(room=10_000)
    await asyncio.wait_for(response({"type": "http"}, connection.receive, socket.send), 60)
    assert source.closed.is_set(), "the event source (the engine request) was closed"
    assert "[DONE]" not in data_lines(socket)
    assert connection.calls == 1


def opening() -> bytes:
    return b"event: open\n\n"


async def test_one_watcher_with_a_keepalive_whether_the_first_event_is_late_or_not() -> None:
    # Late: the first event 0.3 s after a keep-alive of 0.05 s. On time: 1 ms after one of
    # 5 s (room for a loaded machine, which only makes the test take longer).
    for every, after, pinged in ((0.3, 0.05, True), (0.001, 5.0, False)):
        keepalive = Keepalive(b": ping\n\n", 5.0, after=after, opening=opening)
        connection = Connection()
        source = Finite(count=2, every=every)
        response = await open_event_stream(
            connection.receive, source.events(), stall_limit=5.0, keepalive=keepalive
        )
        socket = Socket(room=10_000)
        await asyncio.wait_for(response({"type": "http"}, connection.receive, socket.send), 60)
        body = b"".join(m.get("body", b"") for m in socket.sent)
        assert (b": ping" in body) is pinged
        assert len(data_lines(socket)) == 3  # two events and [DONE]
        assert connection.calls == 1

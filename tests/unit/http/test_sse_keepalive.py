"""A stream's keep-alive (`http.sse.Keepalive`): its ping whenever it sent nothing for the
interval, mid-stream and before its first event (then it begins with it), never counted as
progress, bounded like every send, and giving way to an event that is ready to go."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator

import pytest
from starlette.types import Message

from sluicegate.errors import DeadlineExceededError, OverloadedError
from sluicegate.http.sse import (
    CLOSING_SEND_TIMEOUT,
    EventStreamResponse,
    Keepalive,
    open_event_stream,
)

PING = b": keep-alive\n\n"
EVENT = b'data: {"x": 1}\n\n'


class Script:
    """Events after pauses: `(seconds, event)` pairs, `event` empty for output that shows
    nothing, an exception to raise; notes when it is closed (the engine abort)."""

    def __init__(self, *steps: tuple[float, bytes | Exception]) -> None:
        self.steps = steps
        self.closed = asyncio.Event()

    async def events(self) -> AsyncGenerator[bytes, None]:
        try:
            for pause, event in self.steps:
                await asyncio.sleep(pause)
                if isinstance(event, Exception):
                    raise event
                yield event
        finally:
            self.closed.set()


class Socket:
    """Records what was sent and when; `stop_after` messages, every send blocks (the client
    reads nothing more)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.sent: list[tuple[float, bytes]] = []
        self.stop_after = stop_after
        self.start = time.monotonic()

    async def send(self, message: Message) -> None:
        if self.stop_after is not None and len(self.sent) >= self.stop_after:
            await asyncio.Event().wait()
        self.sent.append((time.monotonic() - self.start, message.get("body", b"")))

    @property
    def body(self) -> bytes:
        return b"".join(body for _, body in self.sent)

    def pings(self) -> list[float]:
        return [at for at, body in self.sent if body == PING]


async def never_disconnects() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def stream(response: EventStreamResponse, socket: Socket) -> float:
    started = time.monotonic()
    await asyncio.wait_for(response({"type": "http"}, never_disconnects, socket.send), 60)
    return time.monotonic() - started


def keepalive(every: float, after: float = 5.0) -> Keepalive:
    return Keepalive(PING, every, after=after)


def data_lines(body: bytes) -> list[str]:
    return [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]


async def test_a_stream_silent_mid_stream_pings_at_the_interval() -> None:
    # An event, 0.5 s of silence, an event: pings every 0.1 s in between, none after.
    source = Script((0.0, EVENT), (0.5, EVENT), (0.0, EVENT))
    response = EventStreamResponse(source.events(), stall_timeout=5.0, keepalive=keepalive(0.1))
    socket = Socket()
    await stream(response, socket)
    bodies = [body for _, body in socket.sent]
    first, second = bodies.index(EVENT), bodies.index(EVENT, bodies.index(EVENT) + 1)
    between = bodies[first + 1 : second]
    # 0.5 s / 0.1 s: 4 or 5 pings alone; a loaded machine delays some, never adds.
    assert between and set(between) == {PING} and len(between) <= 5, bodies
    assert PING not in bodies[second:]
    gaps = [b - a for a, b in zip(socket.pings(), socket.pings()[1:], strict=False)]
    assert all(gap >= 0.09 for gap in gaps), gaps  # one per interval, not a burst
    assert data_lines(socket.body) == ['{"x": 1}'] * 3 + ["[DONE]"]


async def test_a_stream_whose_events_keep_coming_sends_no_ping() -> None:
    source = Script(*[(0.01, EVENT)] * 40)
    response = EventStreamResponse(source.events(), stall_timeout=5.0, keepalive=keepalive(0.2))
    socket = Socket()
    await stream(response, socket)
    assert socket.pings() == []
    assert len(data_lines(socket.body)) == 41


async def test_output_that_shows_nothing_is_progress_that_pings() -> None:
    # 0.6 s of empty events 20 ms apart (thoughts left out), under a 0.25 s stall limit: the
    # source is working, so the stream goes on, and since nothing shows, it pings.
    source = Script((0.0, EVENT), *[(0.02, b"")] * 30, (0.0, EVENT))
    response = EventStreamResponse(source.events(), stall_timeout=0.25, keepalive=keepalive(0.1))
    socket = Socket()
    await stream(response, socket)
    assert data_lines(socket.body) == ['{"x": 1}', '{"x": 1}', "[DONE]"], socket.body
    assert len(socket.pings()) >= 2


async def test_pings_are_not_progress_a_silent_source_still_stalls() -> None:
    # Pinging every 0.05 s does not keep a source silent for 30 s alive past its 0.3 s bound.
    source = Script((0.0, EVENT), (30.0, EVENT))
    response = EventStreamResponse(source.events(), stall_timeout=0.3, keepalive=keepalive(0.05))
    socket = Socket()
    took = await stream(response, socket)
    assert took < 10.0, f"ended after {took:.2f} s, not at its 0.3 s stall limit"
    assert source.closed.is_set()
    assert len(socket.pings()) >= 2
    events = data_lines(socket.body)
    assert json.loads(events[1])["error"]["code"] == "timeout" and events[-1] == "[DONE]"


async def test_a_ping_to_a_client_that_reads_nothing_is_bounded() -> None:
    # The start and the first event go out, then every send blocks: the first ping's too.
    source = Script((0.0, EVENT), (30.0, EVENT))
    response = EventStreamResponse(source.events(), stall_timeout=0.3, keepalive=keepalive(0.05))
    socket = Socket(stop_after=2)
    took = await stream(response, socket)
    # The stall limit, then the closing send's own: far under the source's 30 s.
    assert took < 5 * (0.3 + CLOSING_SEND_TIMEOUT), f"released after {took:.2f} s"
    assert source.closed.is_set()
    assert [body for _, body in socket.sent][1:] == [EVENT]


async def test_a_ping_waiting_for_the_socket_gives_way_to_the_next_event() -> None:
    # The socket is full after the first event: the ping that comes due waits; the next event
    # replaces it (one writer at a time) and goes out once the socket has room again.
    room, stuck = asyncio.Event(), asyncio.Event()
    socket = Socket()
    waiting: list[bytes] = []

    async def send(message: Message) -> None:
        if len(socket.sent) >= 2 and not room.is_set():  # the start and the first event
            waiting.append(message.get("body", b""))
            stuck.set()
            if len(waiting) == 2:  # the ping, then the event
                asyncio.get_running_loop().call_later(0.05, room.set)
            await room.wait()
        await socket.send(message)

    async def events() -> AsyncGenerator[bytes, None]:
        yield EVENT
        await stuck.wait()  # the ping is stuck
        yield b'data: {"x": 2}\n\n'

    response = EventStreamResponse(events(), stall_timeout=5.0, keepalive=keepalive(0.05))
    await asyncio.wait_for(response({"type": "http"}, never_disconnects, send), 60)
    assert waiting[:2] == [PING, b'data: {"x": 2}\n\n'], waiting
    bodies = [body for _, body in socket.sent]
    assert bodies[1:3] == [EVENT, b'data: {"x": 2}\n\n'] and PING not in bodies, bodies
    assert data_lines(socket.body) == ['{"x": 1}', '{"x": 2}', "[DONE]"]


async def test_a_slow_first_event_begins_the_stream_with_a_ping_then_pings() -> None:
    source = Script((2.0, EVENT), (0.0, EVENT))
    opened = time.monotonic()
    response = await open_event_stream(
        never_disconnects, source.events(), stall_limit=5.0, keepalive=keepalive(0.1, after=0.1)
    )
    # Begun after 0.1 s, before the event (2 s: a margin a loaded machine keeps); the status
    # committed: 200, then a ping.
    assert time.monotonic() - opened < 1.5 and not source.closed.is_set()
    socket = Socket()
    await stream(response, socket)
    bodies = [body for _, body in socket.sent]
    assert bodies[0] == b"" and bodies[1] == PING
    # Pings until the event, at most one every 0.1 s: at least one, at most 2.0 / 0.1 + 1.
    pings = bodies.index(EVENT) - 1
    assert 1 <= pings <= 21 and set(bodies[1 : bodies.index(EVENT)]) == {PING}
    assert data_lines(socket.body) == ['{"x": 1}', '{"x": 1}', "[DONE]"]


async def test_an_error_before_the_interval_keeps_its_status() -> None:
    source = Script((0.01, OverloadedError()))
    with pytest.raises(OverloadedError):
        await open_event_stream(
            never_disconnects, source.events(), stall_limit=5.0, keepalive=keepalive(5.0, 5.0)
        )
    assert source.closed.is_set()


async def test_an_error_after_the_stream_began_is_an_error_event() -> None:
    source = Script((0.3, OverloadedError()))
    response = await open_event_stream(
        never_disconnects, source.events(), stall_limit=5.0, keepalive=keepalive(0.1, 0.1)
    )
    socket = Socket()
    await stream(response, socket)
    assert socket.sent[1][1] == PING
    events = data_lines(socket.body)
    assert json.loads(events[0])["error"]["code"] == "overloaded" and events[-1] == "[DONE]"


async def test_a_first_event_that_never_comes_ends_at_its_own_limit() -> None:
    source = Script((30.0, EVENT))
    started = time.monotonic()
    response = await open_event_stream(
        never_disconnects, source.events(), stall_limit=0.4, keepalive=keepalive(0.05, 0.05)
    )
    socket = Socket()
    await stream(response, socket)
    took = time.monotonic() - started
    assert took < 10.0, f"ended after {took:.2f} s, not at its 0.4 s limit"
    assert source.closed.is_set() and len(socket.pings()) >= 2
    events = data_lines(socket.body)
    assert json.loads(events[0])["error"]["code"] == "timeout" and events[-1] == "[DONE]"


async def test_a_deadline_before_the_interval_is_a_timeout_and_the_source_is_closed() -> None:
    # The whole request's 0.2 s run out while the first event was still awaited, before the
    # 5 s interval: a 504, the source (the engine request) closed. It was a 500 (closing a
    # generator still making its event) on Anthropic's stream with REQUEST_TIMEOUT under
    # STREAM_PING_AFTER.
    source = Script((30.0, EVENT))
    deadline = asyncio.get_running_loop().time() + 0.2
    with pytest.raises(DeadlineExceededError):
        await open_event_stream(
            never_disconnects,
            source.events(),
            deadline=deadline,
            stall_limit=5.0,
            keepalive=keepalive(5.0, 5.0),
        )
    assert source.closed.is_set()

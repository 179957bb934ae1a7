"""The event stream against a client that stops reading: every send is bounded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator

from starlette.types import Message

from sluicegate.http.sse import CLOSING_SEND_TIMEOUT, EventStreamResponse

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


async def stream_into(socket: Socket) -> tuple[Source, float]:
    source = Source()
    response = EventStreamResponse(source.events(), stall_timeout=STALL)
    started = time.monotonic()
    await asyncio.wait_for(response({"type": "http"}, never_disconnects, socket.send), 10)
    return source, time.monotonic() - started


async def test_a_client_that_reads_nothing_more_releases_the_stream_in_bounded_time() -> None:
    socket = Socket(room=5)
    source, took = await stream_into(socket)
    assert source.closed.is_set(), "the event source (the engine request) was closed"
    assert took < 5 * 0.01 + STALL + CLOSING_SEND_TIMEOUT + 0.5
    # The error event could not be written either; the response is left unfinished, so the
    # server drops the connection.
    assert len(socket.sent) == 5
    assert all(m.get("more_body", True) for m in socket.sent)


async def test_the_error_event_goes_out_when_the_client_reads_again() -> None:
    socket = Socket(room=5, stuck=1)
    source, _ = await stream_into(socket)
    assert source.closed.is_set()
    tail = b"".join(m.get("body", b"") for m in socket.sent[5:])
    events = [line[6:] for line in tail.decode().splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["error"]["code"] == "timeout"
    assert events[-1] == "[DONE]"
    assert socket.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}

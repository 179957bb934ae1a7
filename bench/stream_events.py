"""What `http.sse` costs per event and per stream: micro-measures of the stream's pump.

Per event: a source that never waits yields `--events` events into a `send` that takes each
at once, with the stall bound armed (60 s) and, where the tree has one, the keep-alive (15 s).
Per stream: `--streams` streams of two events each opened (`open_event_stream`, the first
event on time) and sent, with the request's deadline, without and with the keep-alive. On
uvloop; CPU time (`time.process_time`, less moved by other processes on a busy machine than
the wall clock), best and median of `--runs`. It measures the tree on `PYTHONPATH`, so two
revisions are compared by running it on each in turn:

    git archive REV src | tar -x -C /tmp/rev
    PYTHONPATH=/tmp/rev/src .venv/bin/python bench/stream_events.py
    PYTHONPATH=src .venv/bin/python bench/stream_events.py
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import statistics
import time
from collections.abc import AsyncGenerator
from typing import Any

import uvloop

from sluicegate.http import sse

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


async def _source(count: int) -> AsyncGenerator[bytes, None]:
    for _ in range(count):
        yield EVENT


async def _stream() -> AsyncGenerator[bytes, None]:
    await asyncio.sleep(0)  # the first event takes a turn of the loop, as an engine's does
    yield EVENT
    yield EVENT


async def _send(message: Any) -> None:
    return None


async def _receive() -> Any:
    await asyncio.Event().wait()


def _keepalive() -> Any:
    """A 15 s keep-alive, where the tree's `Keepalive` is the mid-stream one (its first
    field the ping); None before it."""
    if next(iter(inspect.signature(sse.Keepalive).parameters)) != "ping":
        return None
    return sse.Keepalive(b": keep-alive\n\n", 15.0, after=15.0)


async def per_event(count: int, keepalive: Any) -> float:
    """Microseconds of CPU per event for one stream of `count` events."""
    response = sse.EventStreamResponse(_source(count), stall_timeout=60.0, keepalive=keepalive)
    started = time.process_time()
    await response({"type": "http"}, _receive, _send)
    return (time.process_time() - started) / count * 1e6


async def per_stream(count: int, keepalive: Any) -> float:
    """Microseconds of CPU per stream, opened and sent, for `count` streams."""
    loop = asyncio.get_running_loop()
    started = time.process_time()
    for _ in range(count):
        response = await sse.open_event_stream(
            _receive, _stream(), deadline=loop.time() + 600, stall_limit=60.0, keepalive=keepalive
        )
        await response({"type": "http"}, _receive, _send)
    return (time.process_time() - started) / count * 1e6


async def measure(events: int, streams: int, runs: int) -> None:
    keepalive = _keepalive()
    for label, ping in (("without keep-alive", None), ("with keep-alive", keepalive)):
        if label == "with keep-alive" and keepalive is None:
            print("with keep-alive: not in this tree")
            continue
        times = [await per_event(events, ping) for _ in range(runs)]
        best, median = min(times), statistics.median(times)
        print(f"{label}: best {best:.3f} us/event, median {median:.3f} ({runs} x {events})")
        times = [await per_stream(streams, ping) for _ in range(runs)]
        best, median = min(times), statistics.median(times)
        print(f"{label}: best {best:.1f} us/stream, median {median:.1f} ({runs} x {streams})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--streams", type=int, default=3_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    uvloop.run(measure(args.events, args.streams, args.runs))


if __name__ == "__main__":
    main()

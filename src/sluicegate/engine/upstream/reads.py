"""An upstream's response body as the pieces that came together, not one per HTTP chunk.

A streaming server sends each event as a chunk of its own, and httpx hands them on one by
one, even when one read from the socket brought dozens. Each piece would cost a pass down the
whole pipeline (parse, telemetry, render, a write to the client). `coalesced` reads in a task
of its own and gives the consumer everything that has come since it last asked, joined: one
piece per read the consumer makes, however fast the upstream is. When the consumer keeps up,
nothing waits: each piece is handed on as soon as it comes. When it does not (a slow client
holds the gateway's writes), the reading stops once `limit` bytes wait: the upstream's socket
fills and TCP slows the upstream down, instead of the gateway holding its whole answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

READ_AHEAD_BYTES = 256 * 1024
"""Bytes read ahead of the consumer before the reading waits for it: a few reads of a fast
upstream's burst (httpx reads up to 64 KiB at a time), and at most this plus one read held
per stream (256 MiB for 1,000 streams whose clients all stopped reading)."""


async def coalesced(
    source: AsyncIterator[bytes], limit: int = READ_AHEAD_BYTES
) -> AsyncGenerator[bytes, None]:
    """The bytes of `source`, joined into one piece per wait, with at most `limit` bytes
    (plus the chunk that reached it) read ahead of the consumer. An error of `source` is
    raised after the bytes that came before it; closing this generator stops the reading."""
    pending: list[bytes] = []
    held = 0
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def read() -> None:
        nonlocal held
        try:
            async for chunk in source:
                pending.append(chunk)
                held += len(chunk)
                ready.set()
                if held >= limit:
                    room.clear()  # set again when the consumer takes what is held
                    await room.wait()
        finally:
            ready.set()

    reader = asyncio.create_task(read(), name="upstream-read")
    try:
        while True:
            if not pending:
                if reader.done():
                    break
                ready.clear()  # no await since the check: a chunk or the end sets it again
                await ready.wait()
                continue
            piece = b"".join(pending) if len(pending) > 1 else pending[0]
            pending.clear()
            held = 0
            room.set()
            yield piece
        await reader  # its error, if it ended with one
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        elif not reader.cancelled():
            reader.exception()  # seen: closed early after the source failed, it is not news

"""An upstream's response body as the pieces that came together, not one per HTTP chunk.

A streaming server sends each event as a chunk of its own, and httpx hands them on one by
one, even when one read from the socket brought dozens. Each piece would cost a pass down the
whole pipeline (parse, telemetry, render, a write to the client). `coalesced` reads in a task
of its own and gives the consumer everything that has come since it last asked, joined: one
piece per read the consumer makes, however fast the upstream is. When the consumer keeps up,
nothing waits: each piece is handed on as soon as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator


async def coalesced(source: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
    """The bytes of `source`, joined into one piece per wait. An error of `source` is raised
    after the bytes that came before it; closing this generator stops the reading."""
    pending: list[bytes] = []
    ready = asyncio.Event()

    async def read() -> None:
        try:
            async for chunk in source:
                pending.append(chunk)
                ready.set()
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
            yield piece
        await reader  # its error, if it ended with one
    finally:
        if not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        elif not reader.cancelled():
            reader.exception()  # seen: closed early after the source failed, it is not news

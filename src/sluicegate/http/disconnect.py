"""Abort on disconnect: work for a request is cancelled when its client leaves.

`until_disconnect` gives non-streamed requests (and waits on other requests' results) the
behaviour `sse.EventStreamResponse` has for streams: when the client goes, the work is
cancelled, which closes the engine generator and aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from sluicegate.errors import DeadlineExceededError

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the response was complete."""


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
        # Let the work's own cleanup (closing the engine run, settling its tokens) finish
        # before the caller's: they would otherwise race over the same generators.
        with contextlib.suppress(BaseException):
            await asyncio.wait({task})
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

"""Abort on disconnect: work for a request is cancelled when its client leaves.

`until_disconnect` gives non-streamed requests (and waits on other requests' results) the
behaviour `sse.EventStreamResponse` has for streams: when the client goes, the work is
cancelled, which closes the engine generator and aborts the request in the engine.
"""

from __future__ import annotations

import asyncio
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


def watch_disconnect(receive: Receive) -> asyncio.Future[None]:
    """A watcher of the client's connection, done when the client is gone, for several
    `until_disconnect` in turn (a stream's first event, then the stream). Whoever ends the
    last of them cancels it."""
    return asyncio.ensure_future(wait_for_disconnect(receive))


async def until_disconnect(
    receive: Receive,
    work: Awaitable[T],
    time_limit: float | None = None,
    watcher: asyncio.Future[None] | None = None,
) -> T:
    """Await `work`. If the client leaves first, cancel it and raise `ClientDisconnected`;
    if `time_limit` seconds pass first, cancel it and raise `DeadlineExceededError`.

    The work runs in the caller's own task, cancelled by the disconnect watcher's callback
    (as `asyncio.timeout` cancels it), so each call costs one task, the watcher, not two;
    none when given the `watcher` of an earlier call (`watch_disconnect`), which then goes
    on watching."""
    task = asyncio.current_task()
    assert task is not None
    gone = False
    own = watcher is None

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        nonlocal gone
        if watcher.cancelled():
            return
        watcher.exception()  # retrieved: a `receive` that failed means the client is gone too
        gone = True
        task.cancel()

    if watcher is None:
        watcher = watch_disconnect(receive)
    watcher.add_done_callback(on_disconnect)
    limit = asyncio.timeout(time_limit)
    try:
        async with limit:
            return await work
    except asyncio.CancelledError:
        if gone:
            task.uncancel()
            raise ClientDisconnected() from None
        raise
    except TimeoutError:
        if limit.expired():
            raise DeadlineExceededError() from None
        raise
    finally:
        watcher.remove_done_callback(on_disconnect)
        if own:
            watcher.cancel()

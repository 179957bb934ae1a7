"""Waiting for an operation with a time limit, without cancelling it when the limit passes.

For calls to Redis: cancelling a redis-py operation tears down its connection, and one still
being set up (TLS handshake, AUTH) on a link slower than the limit would never finish. An
abandoned operation runs on in the background until it completes or the client's socket
timeout ends it, and its connection goes back to the pool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

T = TypeVar("T")


class Abandoned(TimeoutError):
    """The operation did not finish in time; it goes on in the background."""


class Deadline:
    """`await deadline.run(op)`: the result, or `Abandoned` after `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._abandoned: set[asyncio.Future[Any]] = set()

    async def run(self, op: Awaitable[T]) -> T:
        task = asyncio.ensure_future(op)
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.seconds)
        except TimeoutError:
            self._abandoned.add(task)
            task.add_done_callback(self._forget)
            raise Abandoned(f"no answer within {self.seconds * 1000:.0f} ms") from None
        except asyncio.CancelledError:
            task.cancel()  # the caller itself is going away
            raise

    def _forget(self, task: asyncio.Future[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved, so asyncio does not log it as lost

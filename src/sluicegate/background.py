"""One background task a component owns: started in the running event loop, and stopped
(cancelled, then awaited, so that nothing of it outlives the component) when it closes.

A cancellation can be lost on its way into the task: code that turns one arriving as its
own time limit passes into a `TimeoutError` (Python 3.11's `asyncio.wait_for` is known to)
makes it a failed round to the loops here, which catch that and go on. The task is then
cancelled again until it ends. Seen in a CI run: a worker's shutdown waited for good on the
cache's invalidation listener, which had gone back to its retry sleep while cancelled; its
supervisor was killed after a minute and the worker was left running.

A task that ends by an exception is a loop that stopped for good (the loops here catch what
they expect): that is logged as an ERROR, never silent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any

logger = logging.getLogger(__name__)

CANCEL_AGAIN_AFTER = 0.5
"""Seconds a cancelled task has to end before it is cancelled again."""


class Background:
    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        self._task = asyncio.get_running_loop().create_task(work)
        self._task.add_done_callback(_ended)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        while not (await asyncio.wait({task}, timeout=CANCEL_AGAIN_AFTER))[0]:
            logger.warning("%s went on after it was cancelled: cancelled again", task.get_name())
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        logger.error("%s stopped for good", task.get_name(), exc_info=exc)

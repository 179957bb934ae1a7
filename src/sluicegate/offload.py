"""Work proportional to input size, run off the event loop and bounded.

Below `inline_limit` (in characters or bytes of input) the work runs inline: a thread hop
costs more than it. Above, it runs in a small thread pool, so a few large requests at once
queue there instead of stalling the loop. A thread helps only with work that lets go of the
GIL (the tokenizers' Rust core, hashing) or that runs Python bytecode between short C calls:
the loop takes the GIL back every `sys.getswitchinterval()` (1 ms, as `server` sets it). One
long C call that holds the GIL (a regex over megabytes, parsing a large JSON body) must be
cut into pieces, as `inference.truncation.collapse_whitespace` does, or sent to another
process (`api.route.LargeBodyRoute`).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from typing_extensions import ParamSpec

from sluicegate.child_process import start_worker

P = ParamSpec("P")
R = TypeVar("R")

INLINE_LIMIT = 64 * 1024


class Offload:
    def __init__(self, workers: int = 2, inline_limit: int = INLINE_LIMIT) -> None:
        self._workers = workers
        self.inline_limit = inline_limit
        self._executor: ThreadPoolExecutor | None = None

    async def run(self, size: int, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)`, inline when `size` is small, else in the pool."""
        if size <= self.inline_limit:
            return fn(*args, **kwargs)
        return await self.call(fn, *args, **kwargs)

    async def call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """`fn(*args, **kwargs)` in the pool, whatever its input's size (work whose cost the
        size does not tell: a small image may hold many pixels)."""
        if self._executor is None:  # made on first use: most processes never need it
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="offload")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))


offload = Offload()
"""The process's pool for input-sized work that has no pool of its own."""


class QueueFullError(Exception):
    """`ProcessOffload` holds as many calls as it may, in all (`mine` False) or of the
    caller's owner (`mine`)."""

    def __init__(self, waiting: int, mine: bool) -> None:
        super().__init__(f"{waiting} calls wait for the worker process")
        self.waiting = waiting
        self.mine = mine


class ProcessOffload:
    """One worker process, made on first use, for work that holds the GIL for long: the
    calls wait their turn in it, so at most one runs at a time. `fn` and its arguments must
    pickle. A worker that died (killed, out of memory) is replaced for the next call.

    The calls held (running or waiting) are bounded, `max_calls` in all and
    `max_calls_per_owner` of one owner (an API key): past either, `run` raises
    `QueueFullError` at once, so one owner's backlog neither grows without end nor fills
    the queue the others wait in."""

    def __init__(self, max_calls: int = 16, max_calls_per_owner: int = 4) -> None:
        self._executor: ProcessPoolExecutor | None = None
        self._max_calls = max_calls
        self._max_per_owner = max_calls_per_owner
        self._calls = 0
        self._by_owner: dict[str, int] = {}

    async def run(self, fn: Callable[..., R], *args: object, owner: str = "") -> R:
        held = self._by_owner.get(owner, 0)
        if held >= self._max_per_owner:
            raise QueueFullError(held, mine=True)
        if self._calls >= self._max_calls:
            raise QueueFullError(self._calls, mine=False)
        self._calls += 1
        self._by_owner[owner] = held + 1
        try:
            return await self._run(fn, *args)
        finally:
            self._calls -= 1
            left = self._by_owner[owner] - 1
            if left:
                self._by_owner[owner] = left
            else:
                del self._by_owner[owner]

    async def _run(self, fn: Callable[..., R], *args: object) -> R:
        if self._executor is None:
            # spawn, as vLLM's engine core is started: a fork of a process with threads and
            # an event loop is not safe.
            context = multiprocessing.get_context("spawn")
            # Deaf to a stop signal sent to the whole group: the calls of the drain go on in
            # it, and `shutdown` ends it afterwards (see `child_process`).
            self._executor = ProcessPoolExecutor(
                1, mp_context=context, initializer=start_worker, initargs=(os.getpid(),)
            )
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except BrokenProcessPool:
            self.shutdown()
            raise

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

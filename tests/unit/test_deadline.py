"""`Deadline`: a time limit that abandons the operation instead of cancelling it."""

from __future__ import annotations

import asyncio
import gc

import pytest

from sluicegate.deadline import Abandoned, Deadline


async def test_a_quick_operation_returns_its_result() -> None:
    async def quick() -> int:
        await asyncio.sleep(0.001)
        return 7

    assert await Deadline(1.0).run(quick()) == 7


async def test_a_slow_operation_is_abandoned_and_finishes_in_the_background() -> None:
    finished = asyncio.Event()

    async def slow() -> None:
        # E.g. a connection still being set up: 50 times the deadline, so that a loaded
        # machine holding this process up cannot let it finish before the deadline is seen.
        await asyncio.sleep(0.5)
        finished.set()

    with pytest.raises(Abandoned):
        await Deadline(0.01).run(slow())
    assert not finished.is_set()
    await asyncio.wait_for(finished.wait(), 5.0)


async def test_an_abandoned_failure_is_not_reported_as_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def fails_late() -> None:
        await asyncio.sleep(0.05)
        raise ConnectionError("gone")

    with pytest.raises(TimeoutError):
        await Deadline(0.01).run(fails_late())
    await asyncio.sleep(0.1)
    gc.collect()
    await asyncio.sleep(0)
    assert "exception was never retrieved" not in caplog.text


async def test_cancelling_the_caller_cancels_the_operation() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def op() -> None:
        started.set()
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    caller = asyncio.create_task(Deadline(5.0).run(op()))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await asyncio.wait_for(cancelled.wait(), 1.0)

"""`background.Background`: a stopped task ends, even one that loses its first cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from sluicegate.background import Background


async def test_a_stopped_task_is_cancelled_and_awaited() -> None:
    ended = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()

    background = Background()
    background.start(work())
    await asyncio.sleep(0)
    await background.stop()
    assert ended.is_set()


async def test_a_task_that_swallows_its_cancellation_is_cancelled_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As a loop does when a library turns the cancellation into a timeout it catches."""
    rounds = 0

    async def work() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if rounds == 1:
                    continue  # lost: taken for a failed round
                raise

    background = Background()
    background.start(work())
    await asyncio.sleep(0)
    # Bounded: without a second cancellation the stop waits for good.
    async with asyncio.timeout(30):
        await background.stop()
    assert rounds == 2
    assert "went on after it was cancelled" in caplog.text


async def test_a_task_that_ends_by_an_exception_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """A loop that stops for good is an ERROR, not a silence (a key follower that died so left
    every revocation unapplied)."""

    async def work() -> None:
        raise OverflowError("cannot convert float infinity to integer")

    background = Background()
    background.start(work())
    with caplog.at_level(logging.ERROR, logger="sluicegate.background"):
        await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the task ends, then its done callback runs
    assert "stopped for good" in caplog.text and "OverflowError" in caplog.text
    with contextlib.suppress(OverflowError):
        await background.stop()

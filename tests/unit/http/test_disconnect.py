from __future__ import annotations

import asyncio

import pytest

from sluicegate.errors import DeadlineExceededError
from sluicegate.http.disconnect import ClientDisconnected, until_disconnect


async def test_until_disconnect_returns_the_result_when_the_client_stays() -> None:
    never = asyncio.Event()

    async def receive() -> dict[str, str]:
        await never.wait()
        return {"type": "http.disconnect"}

    async def work() -> int:
        return 42

    assert await until_disconnect(receive, work()) == 42


async def _long_work(cancelled: asyncio.Event) -> None:
    """Work that would take 30 s, and sets `cancelled` when it is cancelled."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        cancelled.set()
        raise


async def test_until_disconnect_cancels_the_work_when_the_client_leaves() -> None:
    cancelled = asyncio.Event()

    async def receive() -> dict[str, str]:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnected):
        await until_disconnect(receive, _long_work(cancelled))
    assert cancelled.is_set()


async def test_until_disconnect_passes_errors_through() -> None:
    async def receive() -> dict[str, str]:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def work() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await until_disconnect(receive, work())


async def _stays() -> dict[str, str]:
    await asyncio.sleep(30)
    return {"type": "http.disconnect"}


async def test_the_work_runs_in_the_callers_task_beside_one_watcher() -> None:
    caller = asyncio.current_task()
    before = len(asyncio.all_tasks())

    async def work() -> tuple[asyncio.Task[object] | None, int]:
        await asyncio.sleep(0)
        return asyncio.current_task(), len(asyncio.all_tasks())

    task, running = await until_disconnect(_stays, work())
    assert task is caller
    assert running == before + 1  # the disconnect watcher, and no task for the work


async def test_a_time_limit_cancels_the_work_as_a_deadline() -> None:
    cancelled = asyncio.Event()
    with pytest.raises(DeadlineExceededError):
        await until_disconnect(_stays, _long_work(cancelled), 0.01)
    assert cancelled.is_set()


async def test_the_works_own_timeout_error_is_not_taken_for_the_time_limit() -> None:
    async def work() -> None:
        raise TimeoutError("the work's own")

    with pytest.raises(TimeoutError, match="the work's own"):
        await until_disconnect(_stays, work(), 30)


async def test_after_a_disconnect_the_callers_task_is_not_left_cancelled() -> None:
    async def leaves() -> dict[str, str]:
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnected):
        await until_disconnect(leaves, asyncio.sleep(30))
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.01)  # would raise CancelledError if a cancellation were left over


async def test_a_cancellation_from_elsewhere_is_not_a_disconnect() -> None:
    async def caller() -> None:
        await until_disconnect(_stays, asyncio.sleep(30))

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

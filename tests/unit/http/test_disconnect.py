from __future__ import annotations

import asyncio

import pytest

from sluicegate.http.disconnect import ClientDisconnected, until_disconnect


async def test_until_disconnect_returns_the_result_when_the_client_stays() -> None:
    never = asyncio.Event()

    async def receive() -> dict[str, str]:
        await never.wait()
        return {"type": "http.disconnect"}

    async def work() -> int:
        return 42

    assert await until_disconnect(receive, work()) == 42


async def test_until_disconnect_cancels_the_work_when_the_client_leaves() -> None:
    cancelled = asyncio.Event()

    async def receive() -> dict[str, str]:
        await asyncio.sleep(0.01)
        return {"type": "http.disconnect"}

    async def work() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(ClientDisconnected):
        await until_disconnect(receive, work())
    assert cancelled.is_set()


async def test_until_disconnect_passes_errors_through() -> None:
    async def receive() -> dict[str, str]:
        await asyncio.sleep(30)
        return {"type": "http.disconnect"}

    async def work() -> None:
        raise ValueError("bad")

    with pytest.raises(ValueError, match="bad"):
        await until_disconnect(receive, work())

"""`offload.ProcessOffload`'s bound on the calls it holds, in all and per owner (a real
worker process)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.offload import ProcessOffload, QueueFullError
from tests.support.fakes import FAKE_MODEL, fake_app


async def test_calls_past_the_bounds_are_refused_at_once_and_the_slots_come_back() -> None:
    processes = ProcessOffload(max_calls=2, max_calls_per_owner=1)
    try:
        first = asyncio.create_task(processes.run(time.sleep, 0.5, owner="a"))
        await asyncio.sleep(0)  # it holds its slot from its first step
        with pytest.raises(QueueFullError) as mine:
            await processes.run(time.sleep, 0, owner="a")
        assert mine.value.mine and mine.value.waiting == 1
        second = asyncio.create_task(processes.run(time.sleep, 0, owner="b"))
        await asyncio.sleep(0)
        with pytest.raises(QueueFullError) as everyone:
            await processes.run(time.sleep, 0, owner="c")
        assert not everyone.value.mine and everyone.value.waiting == 2
        await asyncio.gather(first, second)
        assert await processes.run(abs, -3, owner="a") == 3  # the slots came back
    finally:
        processes.shutdown()


def test_through_the_app_one_keys_large_bodies_past_its_bound_get_a_429(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = ProcessOffload._run
    entered = threading.Event()

    async def slow(self: ProcessOffload, *args: Any) -> Any:
        entered.set()
        await asyncio.sleep(1.0)  # the parse process busy: the first body holds its slot
        return await run(self, *args)

    monkeypatch.setattr(ProcessOffload, "_run", slow)
    large = {
        "model": FAKE_MODEL,
        "messages": [{"role": "user", "content": "word " * 60_000}],
        "max_tokens": 1,
    }
    app = fake_app(max_large_body_parses_per_key=1)
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        sent = [pool.submit(client.post, "/v1/chat/completions", json=large)]
        # The second is sent while the first waits for the process (polled, not a fixed
        # wait that a loaded machine could outlast before the first had its slot).
        assert entered.wait(30), "the first body never reached the parse process"
        sent.append(pool.submit(client.post, "/v1/chat/completions", json=large))
        responses = [future.result() for future in sent]
    statuses = [r.status_code for r in responses]
    # The first is parsed (then too long for the fake model's 64 tokens: a 400 that says
    # so); the second is over the key's bound.
    assert statuses == [400, 429], [r.text for r in responses]
    assert responses[0].json()["error"]["code"] == "context_length_exceeded"
    refused = responses[1]
    assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
    assert refused.headers["retry-after"] == "1"

"""`BudgetKeeper` alone, against a Redis of its own that dies: the share it admits by itself,
and what it admitted meanwhile added in Redis once Redis is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis
import redis.asyncio

from sluicegate.errors import BudgetExceededError
from sluicegate.keys import KeyBudget
from sluicegate.quota.budgets import BudgetKeeper
from tests.support.redis_server import running_redis

BUDGET = KeyBudget(1000, "tokens", "day")


def _counter(server_url: str, prefix: str) -> int:
    client = redis.Redis.from_url(server_url)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    value = client.get(f"{prefix}:budget:{{key-a}}:{day}:tokens")
    client.close()
    return int(value or 0)


def _held(server_url: str, prefix: str) -> int:
    """The headroom the processes hold for key-a as Redis records it (counted in `_counter`)."""
    client = redis.Redis.from_url(server_url)
    day = time.strftime("%Y-%m-%d", time.gmtime())
    held = client.hgetall(f"{prefix}:budget:{{key-a}}:{day}:tokens:held")
    client.close()
    return sum(int(v) for k, v in held.items() if not k.endswith(b":reclaimed"))


async def test_with_redis_down_a_replica_admits_its_share_of_what_was_left(
    tmp_path: Path, prefix: str
) -> None:
    with running_redis(tmp_path, persist=True) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        keeper = BudgetKeeper(client, prefix=prefix, local_share=0.5, retry_interval=0.1)
        first = await keeper.reserve("key-a", BUDGET, 400)  # near enough the end: in Redis
        keeper.settle(first, 400)
        server.kill()
        # 600 left when Redis last answered: this replica may use half of it, 300.
        admitted = [await keeper.reserve("key-a", BUDGET, 100) for _ in range(3)]
        with pytest.raises(BudgetExceededError) as refused:
            await keeper.reserve("key-a", BUDGET, 100)
        assert refused.value.code == "insufficient_quota"
        keeper.settle(admitted[0], 40)  # used less than it reserved: 60 back
        server.start()
        await keeper.sync()
        assert _counter(server.url, prefix) == 400 + 240
        await keeper.close()
        await client.aclose()


async def test_a_reservation_whose_answer_never_came_counts_once(
    tmp_path: Path, prefix: str
) -> None:
    """Redis blocked past the call's timeout: the reservation is decided here, and whether
    Redis made it when it woke or not, it is counted once there (its change, sent again under
    its number, is applied at most once)."""
    with running_redis(tmp_path, persist=True) as server:
        client = redis.asyncio.Redis.from_url(server.url)
        keeper = BudgetKeeper(client, prefix=prefix, op_timeout=0.1, retry_interval=0.05)
        # Paused for 30 times the call's timeout, from before the call: a loaded machine
        # cannot let Redis wake in time to answer it.
        server.pause(3.0)
        await asyncio.to_thread(server.wait_until_paused)
        hold = await keeper.reserve("key-a", BUDGET, 100)  # no answer in time: decided here
        assert hold.reserved == 100
        await asyncio.to_thread(server.wait_until_awake)  # and may run the call it had queued
        await keeper.sync()
        # Counted once, beside what this process holds as headroom (none when the pause made
        # the key idle, twice what was asked otherwise).
        assert _counter(server.url, prefix) - _held(server.url, prefix) == 100
        # Confirmed, the change no longer counts here as well as there: 1000 - 100 - 50 left.
        more = await keeper.reserve("key-a", BUDGET, 50)
        assert more.headers["x-sluicegate-budget-remaining"] == "850"
        keeper.settle(more, 0)
        keeper.settle(hold, 60)
        await keeper.sync()
        await keeper.sync()  # nothing is applied twice (and, no more asked, the headroom back)
        assert _counter(server.url, prefix) == 60
        await keeper.close()
        await client.aclose()


async def test_a_pause_shorter_than_the_socket_timeout_costs_no_connection(
    tmp_path: Path, prefix: str
) -> None:
    """Redis asleep past the call's own timeout (0.1 s), within the pool's socket timeout
    (1 s): the reservation is decided here, and the pooled connection is waited for rather
    than torn down (a cancelled redis-py call closes its connection)."""
    from sluicegate.wiring import redis_client

    with running_redis(tmp_path) as server:
        client = redis_client(server.url, max_connections=1)
        keeper = BudgetKeeper(client, prefix=prefix, op_timeout=0.1, retry_interval=0.05)
        first = await keeper.reserve("key-a", BUDGET, 400)  # near enough the end: in Redis
        keeper.settle(first, 400)

        async def reserve() -> None:
            hold = await keeper.reserve("key-a", BUDGET, 100)
            assert hold.reserved == 100  # decided here

        raised, kept = await server.across_a_pause(client, reserve, pause=0.5)
        assert raised is None
        assert kept, "the pooled connection was torn down by a 0.5 s pause"
        await keeper.close()
        await client.aclose()

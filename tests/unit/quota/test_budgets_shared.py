"""Several `BudgetKeeper`s over one real Redis, as the gateway's processes (workers, replicas)
share a key's budget: what they admit together, each from the headroom it holds in memory,
never passes the budget, and what they held is given back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis
import redis.asyncio

from sluicegate.errors import BudgetExceededError
from sluicegate.keys import KeyBudget
from sluicegate.quota import budgets
from sluicegate.quota.budgets import BudgetKeeper
from tests.support.redis_server import shared_redis_url

PROCESSES = 4
REQUEST = 1000
BUDGET = KeyBudget(1_000_000, "tokens", "day")


def _counter(prefix: str) -> int:
    client = redis.Redis.from_url(shared_redis_url())
    day = time.strftime("%Y-%m-%d", time.gmtime())
    value = client.get(f"{prefix}:budget:{{key-a}}:{day}:tokens")
    client.close()
    return int(value or 0)


@pytest.fixture
async def keepers(prefix: str) -> AsyncIterator[list[BudgetKeeper]]:
    """One keeper per process, each with a client of its own, syncing as in the gateway."""
    made = [
        BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix, sync_interval=0.02)
        for _ in range(PROCESSES)
    ]
    for keeper in made:
        keeper.start()
    yield made
    for keeper in made:
        await keeper.close()
        await keeper.client.aclose()


async def _spend(keeper: BudgetKeeper) -> int:
    """Requests of `REQUEST` tokens, each using all it reserved, until one is refused: the
    tokens admitted."""
    admitted = 0
    while True:
        try:
            hold = await keeper.reserve("key-a", BUDGET, REQUEST)
        except BudgetExceededError:
            return admitted
        admitted += REQUEST
        await asyncio.sleep(0)  # the other requests (and processes) run meanwhile
        keeper.settle(hold, REQUEST)


async def test_processes_sharing_a_key_never_admit_past_its_budget_together(
    keepers: list[BudgetKeeper], prefix: str
) -> None:
    """Four processes, four requests at a time each: far from the end each admits from the
    headroom it holds (its part of what is left), near it in Redis; the total stays within
    the budget and within a request per process of it."""
    spent = await asyncio.gather(*(_spend(k) for k in keepers for _ in range(4)))
    admitted = sum(spent)
    assert admitted <= BUDGET.limit, f"{admitted} admitted of a budget of {BUDGET.limit}"
    # Each process's last request was refused with less than a request of headroom left.
    assert admitted >= BUDGET.limit - (PROCESSES + 1) * REQUEST, admitted
    for keeper in keepers:
        await keeper.close()
    # Closed, they gave back every headroom they held: Redis holds what was used.
    assert _counter(prefix) == admitted


async def test_a_process_takes_headroom_for_a_busy_key_and_gives_it_back_when_idle(
    prefix: str,
) -> None:
    budget = KeyBudget(20 * REQUEST, "tokens", "day")  # its last tenth, 2 requests, held by none
    keeper = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    other = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    try:
        first = await keeper.reserve("key-a", budget, REQUEST)  # no headroom yet: in Redis
        keeper.settle(first, REQUEST)
        await other.reserve("key-a", budget, REQUEST)  # another process uses the key
        await keeper.sync()  # by hand: neither keeper syncs by itself
        # Twice what was asked since the last sync, reserved in Redis for this process.
        assert _counter(prefix) == 2 * REQUEST + 2 * REQUEST
        assert keeper.reserve_here("key-a", budget, REQUEST) is not None
        assert keeper.reserve_here("key-a", budget, REQUEST) is not None
        for _ in range(8):
            assert keeper.reserve_here("key-a", budget, REQUEST) is None  # none left here
        await keeper.sync()
        # 10 asked for: at most half of what is left before the last tenth, as 2 processes
        # share the key: (20 - 2 - 4) / 2 = 7 requests' worth.
        assert _counter(prefix) == 4 * REQUEST + 7 * REQUEST
        await keeper.close()  # gives it all back
        assert _counter(prefix) == 4 * REQUEST
    finally:
        await keeper.client.aclose()
        await other.client.aclose()


async def test_a_request_larger_than_the_headroom_gives_it_back_with_its_reservation(
    prefix: str,
) -> None:
    """Reserved whole in Redis, in the same call that gives back what its process holds:
    admitted if that makes room, and if refused, nothing is left held here that another
    process's request could have used."""
    budget = KeyBudget(20 * REQUEST, "tokens", "day")
    keeper = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    other = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    try:
        await keeper.reserve("key-a", budget, REQUEST)  # in Redis
        await keeper.sync()  # and twice that held here
        await other.reserve("key-a", budget, 15 * REQUEST)
        assert _counter(prefix) == 18 * REQUEST  # 4 left: 2 held here, 2 in Redis
        with pytest.raises(BudgetExceededError):
            await keeper.reserve("key-a", budget, 5 * REQUEST)
        assert _counter(prefix) == 16 * REQUEST  # what it held went back
        hold = await keeper.reserve("key-a", budget, 3 * REQUEST)
        assert hold.headers["x-sluicegate-budget-remaining"] == str(REQUEST)
        assert _counter(prefix) == 19 * REQUEST
    finally:
        await keeper.client.aclose()
        await other.client.aclose()


@pytest.fixture
async def killed(
    prefix: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[BudgetKeeper, BudgetKeeper]]:
    """A process that took headroom (its first request in Redis, then twice that held),
    admitted one request from it and was killed (never closed, never synced again); then,
    once it is silent past the window, another process's request: the two keepers."""
    monkeypatch.setattr(budgets, "_PROCESS_SECONDS", 0.2)  # instead of 10 s of silence
    gone = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    other = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    try:
        gone.settle(await gone.reserve("key-a", BUDGET, REQUEST), REQUEST)
        await gone.sync()
        assert _counter(prefix) == 3 * REQUEST  # its request and 2 held
        assert gone.reserve_here("key-a", BUDGET, REQUEST) is not None  # 1 left held
        await asyncio.sleep(0.3)
        await other.reserve("key-a", BUDGET, REQUEST)
        yield gone, other
    finally:
        await gone.client.aclose()
        await other.client.aclose()


async def test_the_headroom_of_a_killed_process_is_taken_back_once_it_has_gone_silent(
    killed: tuple[BudgetKeeper, BudgetKeeper], prefix: str
) -> None:
    """What a killed process held is not counted as used until the period ends: the next
    call of another process once the killed one is silent past the window takes it back
    (what it admitted from it unsynced is lost from the count, as it was in its memory)."""
    assert _counter(prefix) == 2 * REQUEST  # the killed one's request and the other's


async def test_a_process_silent_past_the_window_that_calls_again_has_its_headroom_counted(
    killed: tuple[BudgetKeeper, BudgetKeeper], prefix: str
) -> None:
    """Cut from Redis that long rather than killed, it may have admitted from its headroom
    meanwhile: what was taken back is counted again at its next call, and the count stays
    what every process used."""
    away, _ = killed
    assert _counter(prefix) == 2 * REQUEST
    await away.sync()  # back: its 2 held counted again, and 1 more taken (2 held)
    assert _counter(prefix) == 5 * REQUEST
    await away.close()  # gives back the 2 it holds: its 2 requests and the other's
    assert _counter(prefix) == 3 * REQUEST

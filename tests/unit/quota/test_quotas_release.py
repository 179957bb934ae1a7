"""`Quotas.release` cancelled half way (the request's task cancelled while the limiter's
give-back waits on Redis): the tokens, the budget and the model's limit still get back what
the request did not use."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
import redis.asyncio

from sluicegate.errors import RateLimitError
from sluicegate.keys import KeyBudget, KeyPolicy
from sluicegate.quota.budgets import BudgetKeeper
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.quotas import ModelQuota, Quotas
from sluicegate.quota.window import RateLimit
from tests.support.redis_server import shared_redis_url

POLICY = KeyPolicy(tokens_per_minute=100, budget=KeyBudget(100, "tokens", "day"))


class SlowLimiter(MemoryRateLimiter):
    """Its give-backs wait until `opened` (as a Redis call may)."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    async def reconcile(
        self, key_id: str, limit: RateLimit, tokens: int, local: bool = False
    ) -> None:
        await self.opened.wait()
        await super().reconcile(key_id, limit, tokens, local)


async def test_a_release_cancelled_half_way_still_gives_everything_back(prefix: str) -> None:
    limiter = SlowLimiter()
    keeper = BudgetKeeper(redis.asyncio.Redis.from_url(shared_redis_url()), prefix)
    quotas = Quotas(limiter, policies=lambda key_id: POLICY, budgets=keeper)
    model = ModelQuota("m", RateLimit(tokens_per_minute=100))
    try:
        held = await quotas.reserve("key-a", 10, 1, 80, model=model)  # 90 of each 100
        releasing = asyncio.create_task(quotas.release(held, 0, 0))  # no engine took it up
        await asyncio.sleep(0.05)  # waiting on the limiter
        releasing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await releasing
        limiter.opened.set()
        await asyncio.sleep(0.05)  # the give-back goes on by itself
        # All 90 came back to the key's tokens, the model's and the budget: 90 more fit.
        again = await quotas.reserve("key-a", 10, 1, 80, model=model)
        assert again.budget is not None and again.budget.reserved == 90
        with pytest.raises(RateLimitError):  # the model's limit, the key's, its budget
            await quotas.reserve("key-a", 10, 1, 80, model=model)
    finally:
        await keeper.close()
        await keeper.client.aclose()

"""Rate limits against the real Redis at 127.0.0.1:6379, and the in-memory store."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from sluicegate.observability.metrics import RATE_LIMIT_STORE_ERRORS
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.redis_limiter import RedisRateLimiter
from sluicegate.quota.window import RateLimit, format_duration

REDIS_URL = "redis://127.0.0.1:6379/0"
# Generous for the tests that check counting, so a busy machine cannot make them fail open.
SLOW_OK = 2.0


def store_errors() -> float:
    return RATE_LIMIT_STORE_ERRORS._value.get()  # type: ignore[no-any-return]


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def client(prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    yield client
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
def limiter(client: redis.asyncio.Redis, prefix: str) -> RedisRateLimiter:
    return RedisRateLimiter(client, prefix=prefix, op_timeout=SLOW_OK)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---- Redis ---------------------------------------------------------------------------


async def test_rpm_admits_up_to_the_limit_then_refuses(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=3)
    allowed = [await limiter.acquire("key-a", limit, 0) for _ in range(3)]
    assert all(d.allowed for d in allowed)
    assert [d.headers["x-ratelimit-remaining-requests"] for d in allowed] == ["2", "1", "0"]
    assert allowed[0].headers["x-ratelimit-limit-requests"] == "3"
    assert allowed[0].retry_after == 0 and allowed[0].limit is None

    refused = await limiter.acquire("key-a", limit, 0)
    assert not refused.allowed
    assert refused.limit == "requests"
    assert 0 < refused.retry_after <= 60
    assert refused.headers["retry-after"] == "60"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-reset-requests" in refused.headers
    assert "x-ratelimit-limit-tokens" not in refused.headers


async def test_tpm_counts_prompt_tokens_up_front(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(tokens_per_minute=100)
    first = await limiter.acquire("key-a", limit, 60)
    assert first.allowed
    assert first.headers["x-ratelimit-remaining-tokens"] == "40"
    refused = await limiter.acquire("key-a", limit, 41)
    assert not refused.allowed and refused.limit == "tokens"
    assert 0 < refused.retry_after <= 60
    assert (await limiter.acquire("key-a", limit, 40)).allowed


async def test_reconcile_adds_completion_tokens(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=100, tokens_per_minute=100)
    assert (await limiter.acquire("key-a", limit, 30)).allowed
    await limiter.reconcile("key-a", limit, 50)
    refused = await limiter.acquire("key-a", limit, 30)
    assert not refused.allowed and refused.limit == "tokens"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "20"
    # The refused request used no request slot.
    assert refused.headers["x-ratelimit-remaining-requests"] == "99"
    assert (await limiter.acquire("key-a", limit, 20)).allowed


async def test_prompt_larger_than_tpm_is_refused_for_a_full_window(
    limiter: RedisRateLimiter,
) -> None:
    decision = await limiter.acquire("key-a", RateLimit(tokens_per_minute=100), 101)
    assert not decision.allowed and decision.limit == "tokens"
    assert decision.retry_after == 60
    assert decision.headers["retry-after"] == "60"


async def test_entries_older_than_the_window_no_longer_count(
    limiter: RedisRateLimiter, client: redis.asyncio.Redis, prefix: str
) -> None:
    seconds, micros = await client.time()
    now_us = seconds * 1_000_000 + micros
    key = f"{prefix}:rl:{{key-a}}:req"
    # Two entries that left the window a while ago, and one still in it for 15 s more.
    await client.zadd(key, {"old-1": now_us - 70_000_000, "old-2": now_us - 60_500_000})
    await client.zadd(key, {"live": now_us - 45_000_000})
    limit = RateLimit(requests_per_minute=2)
    assert (await limiter.acquire("key-a", limit, 0)).allowed
    refused = await limiter.acquire("key-a", limit, 0)
    assert not refused.allowed
    # Retry-After points at the live old entry, not at the request just admitted.
    assert 13 < refused.retry_after <= 15
    assert await client.zcard(key) == 2


async def test_keys_expire_just_after_the_window(
    limiter: RedisRateLimiter, client: redis.asyncio.Redis, prefix: str
) -> None:
    await limiter.acquire("key-a", RateLimit(10, 1000), 5)
    for suffix in ("req", "tok"):
        ttl = await client.pttl(f"{prefix}:rl:{{key-a}}:{suffix}")
        assert 0 < ttl <= 61_000


async def test_replicas_share_one_limit(prefix: str, client: redis.asyncio.Redis) -> None:
    other_client = redis.asyncio.Redis.from_url(REDIS_URL)
    try:
        one = RedisRateLimiter(client, prefix=prefix, op_timeout=SLOW_OK)
        two = RedisRateLimiter(other_client, prefix=prefix, op_timeout=SLOW_OK)
        limit = RateLimit(requests_per_minute=4)
        decisions = await asyncio.gather(
            *((one if i % 2 else two).acquire("key-a", limit, 0) for i in range(10))
        )
        assert sum(d.allowed for d in decisions) == 4
    finally:
        await other_client.aclose()


async def test_key_ids_have_separate_limits(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=1)
    assert (await limiter.acquire("key-a", limit, 0)).allowed
    assert not (await limiter.acquire("key-a", limit, 0)).allowed
    assert (await limiter.acquire("key-b", limit, 0)).allowed


async def test_unreachable_redis_fails_open_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter = RedisRateLimiter(redis.asyncio.Redis(host="127.0.0.1", port=1))
    before = store_errors()
    with caplog.at_level(logging.WARNING, logger="sluicegate.quota.redis_limiter"):
        for _ in range(3):
            started = time.monotonic()
            decision = await limiter.acquire("key-a", RateLimit(requests_per_minute=1), 0)
            assert time.monotonic() - started < 0.5
            assert decision.allowed and decision.headers == {}
        await limiter.reconcile("key-a", RateLimit(tokens_per_minute=1), 10)
    await limiter.close()
    assert store_errors() - before == 4
    warnings = [r for r in caplog.records if r.name == "sluicegate.quota.redis_limiter"]
    assert len(warnings) == 1
    assert "key-a" in warnings[0].getMessage()


async def test_slow_redis_fails_open_within_the_op_timeout(
    client: redis.asyncio.Redis, prefix: str
) -> None:
    limiter = RedisRateLimiter(client, prefix=prefix, op_timeout=0.05)
    limit = RateLimit(requests_per_minute=10)
    # CLIENT PAUSE WRITE holds scripts that write. Load ours first, with a timeout that a
    # busy machine cannot miss.
    warm = RedisRateLimiter(client, prefix=prefix, op_timeout=SLOW_OK)
    assert (await warm.acquire("key-a", limit, 0)).headers
    pauser = redis.asyncio.Redis.from_url(REDIS_URL)
    before = store_errors()
    try:
        await pauser.client_pause(200, all=False)
        started = time.monotonic()
        decision = await limiter.acquire("key-a", limit, 0)
        elapsed = time.monotonic() - started
    finally:
        await pauser.client_unpause()
        await pauser.aclose()
    assert decision.allowed and decision.headers == {}
    assert elapsed < 0.15
    assert store_errors() - before == 1
    # The client reconnects by itself once Redis answers again.
    recovered = await warm.acquire("key-a", limit, 0)
    assert recovered.allowed and recovered.headers


async def test_unlimited_never_touches_the_store() -> None:
    limiter = RedisRateLimiter(redis.asyncio.Redis(host="127.0.0.1", port=1))
    before = store_errors()
    decision = await limiter.acquire("key-a", RateLimit(), 10_000)
    await limiter.reconcile("key-a", RateLimit(), 10_000)
    await limiter.close()
    assert decision.allowed and decision.headers == {} and decision.retry_after == 0
    assert store_errors() == before


# ---- in memory -----------------------------------------------------------------------


async def test_memory_window_slides() -> None:
    clock = FakeClock()
    limiter = MemoryRateLimiter(clock=clock)
    limit = RateLimit(requests_per_minute=2, tokens_per_minute=100)
    assert (await limiter.acquire("key-a", limit, 10)).allowed
    clock.now += 30
    assert (await limiter.acquire("key-a", limit, 10)).allowed
    refused = await limiter.acquire("key-a", limit, 10)
    assert not refused.allowed and refused.limit == "requests"
    assert refused.retry_after == pytest.approx(30)
    assert refused.headers["x-ratelimit-reset-requests"] == "1m0s"
    clock.now += 30  # the first request is now exactly 60 s old
    allowed = await limiter.acquire("key-a", limit, 10)
    assert allowed.allowed
    assert allowed.headers["x-ratelimit-remaining-tokens"] == "80"
    clock.now += 61
    assert (await limiter.acquire("key-a", limit, 100)).allowed


async def test_memory_tokens_and_reconcile() -> None:
    clock = FakeClock()
    limiter = MemoryRateLimiter(clock=clock)
    limit = RateLimit(tokens_per_minute=100)
    assert (await limiter.acquire("key-a", limit, 30)).allowed
    clock.now += 10
    await limiter.reconcile("key-a", limit, 50)
    refused = await limiter.acquire("key-a", limit, 30)
    assert not refused.allowed and refused.limit == "tokens"
    # Freeing the first 30 tokens is enough, 50 s from now.
    assert refused.retry_after == pytest.approx(50)
    assert refused.headers["retry-after"] == "50"
    too_big = await limiter.acquire("key-b", limit, 101)
    assert not too_big.allowed and too_big.retry_after == 60
    assert (await limiter.acquire("key-b", limit, 100)).allowed


async def test_memory_key_ids_have_separate_limits() -> None:
    limiter = MemoryRateLimiter()
    limit = RateLimit(requests_per_minute=1)
    assert (await limiter.acquire("key-a", limit, 0)).allowed
    assert not (await limiter.acquire("key-a", limit, 0)).allowed
    assert (await limiter.acquire("key-b", limit, 0)).allowed
    assert (await limiter.acquire("key-a", RateLimit(), 0)).allowed


# ---- headers -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.12, "120ms"),
        (0.9994, "999ms"),
        (0.9996, "1s"),
        (1, "1s"),
        (1.5, "1.5s"),
        (45.25, "45.25s"),
        (12.3456, "12.346s"),
        (60, "1m0s"),
        (90, "1m30s"),
        (360, "6m0s"),
        (-3, "0s"),
    ],
)
def test_format_duration_matches_openai(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text

"""The GCRA Lua script against a real Redis (the test process's own), and the fallback to this
replica's share of each limit when Redis is down or slow (a Redis of its own, SIGSTOPped)."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio

from sluicegate.observability.metrics import RATE_LIMIT_LOCAL_DECISIONS, RATE_LIMIT_STORE_ERRORS
from sluicegate.quota.redis_limiter import RedisRateLimiter
from sluicegate.quota.window import RateLimit
from tests.support.redis_server import RedisProcess, shared_redis_url

# Generous for the tests that check counting, so a busy machine cannot make them fall back.
SLOW_OK = 2.0


def store_errors() -> float:
    return RATE_LIMIT_STORE_ERRORS._value.get()  # type: ignore[no-any-return]


def local_decisions() -> float:
    return RATE_LIMIT_LOCAL_DECISIONS._value.get()  # type: ignore[no-any-return]


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
async def client(prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis.from_url(shared_redis_url())
    yield client
    keys = [key async for key in client.scan_iter(match=f"{prefix}:*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
def limiter(client: redis.asyncio.Redis, prefix: str) -> RedisRateLimiter:
    return RedisRateLimiter(client, prefix=prefix, op_timeout=SLOW_OK)


async def server_now(client: redis.asyncio.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * 1_000_000 + int(micros)


# ---- the script ------------------------------------------------------------------------------


async def test_rpm_admits_the_burst_then_refuses(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=3)
    allowed = [await limiter.acquire("key-a", limit, 0) for _ in range(3)]
    assert all(d.allowed and not d.local for d in allowed)
    assert [d.headers["x-ratelimit-remaining-requests"] for d in allowed] == ["2", "1", "0"]
    assert allowed[0].headers["x-ratelimit-limit-requests"] == "3"
    refused = await limiter.acquire("key-a", limit, 0)
    assert not refused.allowed and refused.limit == "requests"
    assert 19 < refused.retry_after <= 20
    assert refused.headers["retry-after"] == "20"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in refused.headers


async def test_tokens_refill_at_the_rate_on_the_server_clock(
    limiter: RedisRateLimiter, client: redis.asyncio.Redis, prefix: str
) -> None:
    limit = RateLimit(tokens_per_minute=60)  # one token a second
    key = f"{prefix}:gcra:{{key-a}}:tok"
    # A key that spent 56 tokens 10 s ago: 46 still count.
    before = await server_now(client)
    await client.set(key, str(before + 46_000_000))
    refused = await limiter.acquire("key-a", limit, 20)
    # What the server's clock moved meanwhile refilled (timed: a loaded machine stalls).
    took = (await server_now(client) - before) / 1e6
    assert not refused.allowed and refused.limit == "tokens"
    assert 6.0 - took <= refused.retry_after <= 6.0
    remaining = int(refused.headers["x-ratelimit-remaining-tokens"])
    assert 14 <= remaining <= 14 + took
    allowed = await limiter.acquire("key-a", limit, remaining)
    assert allowed.allowed


async def test_reconcile_refunds_and_charges(limiter: RedisRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=100, tokens_per_minute=100)
    assert (await limiter.acquire("key-a", limit, 80)).allowed
    await limiter.reconcile("key-a", limit, -50)
    assert (await limiter.acquire("key-a", limit, 0)).headers[
        "x-ratelimit-remaining-tokens"
    ] == "70"
    await limiter.reconcile("key-a", limit, 60)
    refused = await limiter.acquire("key-a", limit, 20)
    assert not refused.allowed and refused.limit == "tokens"
    assert refused.headers["x-ratelimit-remaining-requests"] == "98"
    assert (await limiter.acquire("key-a", limit, 10)).allowed


async def test_keys_are_one_number_per_limit_without_a_ttl(
    limiter: RedisRateLimiter, client: redis.asyncio.Redis, prefix: str
) -> None:
    limit = RateLimit(10, 1000)
    for _ in range(5):
        await limiter.acquire("key-a", limit, 5)
    keys = sorted([key async for key in client.scan_iter(match=f"{prefix}:*")])
    assert keys == [
        f"{prefix}:gcra:{{key-a}}:req".encode(),
        f"{prefix}:gcra:{{key-a}}:tok".encode(),
    ]
    for key in keys:
        # No TTL: a volatile-* eviction policy never takes them.
        assert await client.pttl(key) == -1
        assert await client.type(key) == b"string"
    # Refunding everything leaves a full bucket, kept as no key at all.
    await limiter.reconcile("key-a", limit, -1000)
    assert await client.exists(f"{prefix}:gcra:{{key-a}}:tok") == 0


async def test_replicas_share_one_limit(prefix: str, client: redis.asyncio.Redis) -> None:
    other_client = redis.asyncio.Redis.from_url(shared_redis_url())
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


async def test_unlimited_never_touches_the_store() -> None:
    limiter = RedisRateLimiter(redis.asyncio.Redis(host="127.0.0.1", port=1))
    before = store_errors(), local_decisions()
    decision = await limiter.acquire("key-a", RateLimit(), 10_000)
    await limiter.reconcile("key-a", RateLimit(), 10_000)
    await limiter.close()
    assert decision.allowed and decision.headers == {} and decision.retry_after == 0
    assert (store_errors(), local_decisions()) == before


# ---- Redis down or slow: this replica's share ----------------------------------------------


async def test_unreachable_redis_enforces_the_local_share(caplog: pytest.LogCaptureFixture) -> None:
    limiter = RedisRateLimiter(
        redis.asyncio.Redis(host="127.0.0.1", port=1), local_share=0.5, retry_interval=60
    )
    limit = RateLimit(requests_per_minute=8)
    errors, local = store_errors(), local_decisions()
    with caplog.at_level(logging.WARNING, logger="sluicegate.quota.redis_limiter"):
        started = time.monotonic()
        decisions = [await limiter.acquire("key-a", limit, 0) for _ in range(10)]
        # A refused connection, then the share (a few ms alone): no check hangs on the store.
        took = time.monotonic() - started
        assert took < 5, f"10 checks took {took:.2f} s with Redis unreachable"
    await limiter.close()
    assert [d.allowed for d in decisions] == [True] * 4 + [False] * 6
    assert all(d.local for d in decisions)
    assert decisions[0].headers["x-ratelimit-limit-requests"] == "4"
    assert decisions[-1].headers["retry-after"] == "15"
    # One failed attempt; the rest skip Redis until the retry interval has passed.
    assert store_errors() - errors == 1
    assert local_decisions() - local == 10
    warnings = [r for r in caplog.records if r.name == "sluicegate.quota.redis_limiter"]
    assert len(warnings) == 1
    assert "rate-limit store failed" in warnings[0].getMessage()
    assert "50%" in warnings[0].getMessage()


async def test_a_local_reservation_is_settled_locally() -> None:
    limiter = RedisRateLimiter(redis.asyncio.Redis(host="127.0.0.1", port=1), retry_interval=60)
    limit = RateLimit(tokens_per_minute=100)
    reserved = await limiter.acquire("key-a", limit, 90)
    assert reserved.allowed and reserved.local
    await limiter.reconcile("key-a", limit, -80, local=True)
    assert (await limiter.acquire("key-a", limit, 85)).allowed
    await limiter.close()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.thaw()
    server.kill()


async def test_a_frozen_redis_falls_back_and_comes_back(own_redis: RedisProcess) -> None:
    client = redis.asyncio.Redis.from_url(own_redis.url, socket_timeout=60)
    # The operation timeout is what a check through a live Redis must come within, on a
    # loaded machine too (0.1 s once was not enough for the first one).
    limiter = RedisRateLimiter(client, op_timeout=0.5, local_share=0.25, retry_interval=0.3)
    limit = RateLimit(requests_per_minute=40)
    try:
        assert (await limiter.acquire("key-a", limit, 0)).headers[
            "x-ratelimit-remaining-requests"
        ] == "39"
        own_redis.freeze()
        errors = store_errors()
        started = time.monotonic()
        frozen = [await limiter.acquire("key-a", limit, 0) for _ in range(20)]
        elapsed = time.monotonic() - started
        # The share holds: 40 x 0.25, less the one this replica had just admitted through
        # Redis (the local state shadows it).
        assert sum(d.allowed for d in frozen) == 9
        assert all(d.local for d in frozen)
        # No check waited on the client's 60 s socket timeout: each try of Redis is cut at
        # the 0.5 s operation timeout, and most checks skip it (about 1 s in all alone). The
        # bound is a third of one socket timeout, over 5 times what it takes with both cores
        # busy.
        assert elapsed < 20.0, (
            f"20 checks took {elapsed:.2f} s with Redis frozen; tries that failed: "
            f"{store_errors() - errors:g}"
        )
        own_redis.thaw()
        await asyncio.sleep(0.5)
        back = await limiter.acquire("key-a", limit, 0)
        assert not back.local and back.headers["x-ratelimit-limit-requests"] == "40"
        # The count in Redis went on from where it was: one before, this one, and the checks
        # abandoned while Redis was frozen, which it ran once it woke.
        assert 35 <= int(back.headers["x-ratelimit-remaining-requests"]) <= 38
    finally:
        await client.aclose()


async def test_the_local_share_goes_on_from_what_redis_admitted(own_redis: RedisProcess) -> None:
    client = redis.asyncio.Redis.from_url(own_redis.url)
    limiter = RedisRateLimiter(client, op_timeout=SLOW_OK, retry_interval=60)
    limit = RateLimit(requests_per_minute=10, tokens_per_minute=100)
    try:
        for _ in range(3):
            assert not (await limiter.acquire("key-a", limit, 30)).local
        await limiter.reconcile("key-a", limit, -25)  # one request used 5 of its 30
        own_redis.kill()
        # Redis is gone: this replica has spent 3 of its 10 requests and 65 of its 100
        # tokens, and goes on from there rather than from a fresh burst.
        decision = await limiter.acquire("key-a", limit, 0)
        assert decision.local
        assert decision.headers["x-ratelimit-remaining-requests"] == "6"
        assert decision.headers["x-ratelimit-remaining-tokens"] == "35"
    finally:
        await client.aclose()

"""The GCRA rate limits, in this process, on an injected clock.

The rule they pin (docs/operations.md#rate-limits): a key at N per minute may spend the
whole minute's N at once, and then gets N/60 per second back; so any interval of d seconds
admits at most N + N·d/60 (rounded down), and a steady client gets exactly N a minute.
"""

from __future__ import annotations

import pytest

from sluicegate.quota import gcra
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.window import RateLimit, format_duration
from tests.support.clock import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(1000.0)


@pytest.fixture
def limiter(clock: Clock) -> MemoryRateLimiter:
    return MemoryRateLimiter(clock=clock)


# ---- the algorithm -------------------------------------------------------------------------


def test_a_full_minute_at_once_then_one_per_interval() -> None:
    tat = None
    for _ in range(4):
        step = gcra.conform(tat, 0.0, per_minute=4, cost=1)
        assert step.allowed and step.retry_after == 0
        tat = step.tat
    assert tat == 60.0
    refused = gcra.conform(tat, 0.0, per_minute=4, cost=1)
    assert not refused.allowed and refused.retry_after == 15.0 and refused.tat == 60.0
    assert gcra.conform(tat, 15.0, per_minute=4, cost=1).allowed


def test_a_cost_above_the_limit_never_conforms() -> None:
    # Not even from a full bucket: `Quotas` refuses such a request before any check.
    assert not gcra.conform(None, 0.0, per_minute=100, cost=101).allowed
    assert gcra.conform(None, 0.0, per_minute=100, cost=100).allowed


def test_adjusting_charges_or_gives_back_and_empties_at_now() -> None:
    assert gcra.adjusted(None, 10.0, per_minute=60, cost=5) == 15.0
    assert gcra.adjusted(40.0, 10.0, per_minute=60, cost=-20) == 20.0
    # Giving back more than is owed leaves the bucket full: no state.
    assert gcra.adjusted(40.0, 10.0, per_minute=60, cost=-30) is None
    assert gcra.adjusted(5.0, 10.0, per_minute=60, cost=-1) is None


def test_remaining_counts_whole_units_left() -> None:
    assert gcra.remaining(0.0, per_minute=3) == 3
    assert gcra.remaining(20.0, per_minute=3) == 2
    assert gcra.remaining(20.000001, per_minute=3) == 1
    assert gcra.remaining(60.0, per_minute=3) == 0
    assert gcra.remaining(90.0, per_minute=3) == 0


# ---- the limiter in this process -------------------------------------------------------------


async def test_rpm_admits_the_burst_then_refuses_with_openai_headers(
    limiter: MemoryRateLimiter,
) -> None:
    limit = RateLimit(requests_per_minute=3)
    allowed = [await limiter.acquire("key-a", limit, 0) for _ in range(3)]
    assert all(d.allowed for d in allowed)
    assert [d.headers["x-ratelimit-remaining-requests"] for d in allowed] == ["2", "1", "0"]
    assert [d.headers["x-ratelimit-reset-requests"] for d in allowed] == ["20s", "40s", "1m0s"]
    assert allowed[0].headers["x-ratelimit-limit-requests"] == "3"
    refused = await limiter.acquire("key-a", limit, 0)
    assert not refused.allowed and refused.limit == "requests"
    assert refused.retry_after == pytest.approx(20)
    assert refused.headers["retry-after"] == "20"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in refused.headers


async def test_no_interval_admits_more_than_the_limit_plus_its_refill(
    limiter: MemoryRateLimiter, clock: Clock
) -> None:
    rpm = 10
    admitted: list[float] = []
    for _ in range(600):  # a client trying every half second for five minutes
        if (await limiter.acquire("key-a", RateLimit(requests_per_minute=rpm), 0)).allowed:
            admitted.append(clock.now)
        clock.now += 0.5
    for span in (1.0, 30.0, 60.0, 120.0):
        worst = max(sum(1 for t in admitted if start <= t < start + span) for start in admitted)
        assert worst <= rpm + int(rpm * span / 60), (span, worst)
    # The burst, then exactly the rate: 10 + 10 a minute (the 50th falls at 300 s, just out).
    assert len(admitted) == rpm + 5 * rpm - 1


async def test_tokens_count_their_cost_and_refill_at_the_rate(
    limiter: MemoryRateLimiter, clock: Clock
) -> None:
    limit = RateLimit(tokens_per_minute=600)  # 10 tokens a second
    first = await limiter.acquire("key-a", limit, 500)
    assert first.allowed and first.headers["x-ratelimit-remaining-tokens"] == "100"
    refused = await limiter.acquire("key-a", limit, 150)
    assert not refused.allowed and refused.limit == "tokens"
    assert refused.retry_after == pytest.approx(5)
    clock.now += 5
    later = await limiter.acquire("key-a", limit, 150)
    assert later.allowed and later.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_reconcile_charges_and_refunds(limiter: MemoryRateLimiter, clock: Clock) -> None:
    limit = RateLimit(requests_per_minute=100, tokens_per_minute=600)
    assert (await limiter.acquire("key-a", limit, 400)).allowed
    await limiter.reconcile("key-a", limit, -300)  # reserved 400, used 100
    second = await limiter.acquire("key-a", limit, 0)
    assert second.headers["x-ratelimit-remaining-tokens"] == "500"
    await limiter.reconcile("key-a", limit, 550)  # used more than reserved: a debt
    refused = await limiter.acquire("key-a", limit, 10)
    assert not refused.allowed and refused.limit == "tokens"
    assert refused.retry_after == pytest.approx(6)
    # A refusal spends no request either.
    assert refused.headers["x-ratelimit-remaining-requests"] == "98"
    clock.now += 6
    assert (await limiter.acquire("key-a", limit, 10)).allowed


async def test_both_limits_must_allow(limiter: MemoryRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=1, tokens_per_minute=100)
    refused = await limiter.acquire("key-a", limit, 101)
    assert not refused.allowed and refused.limit == "tokens"
    # The refused check did not spend the one request.
    assert (await limiter.acquire("key-a", limit, 100)).allowed


async def test_key_ids_have_separate_limits(limiter: MemoryRateLimiter) -> None:
    limit = RateLimit(requests_per_minute=1)
    assert (await limiter.acquire("key-a", limit, 0)).allowed
    assert not (await limiter.acquire("key-a", limit, 0)).allowed
    assert (await limiter.acquire("key-b", limit, 0)).allowed
    assert (await limiter.acquire("key-a", RateLimit(), 0)).allowed


async def test_state_is_one_number_per_key_and_limit_and_goes_when_full(
    limiter: MemoryRateLimiter, clock: Clock
) -> None:
    limit = RateLimit(requests_per_minute=10, tokens_per_minute=100)
    for key in ("key-a", "key-b"):
        for _ in range(5):
            await limiter.acquire(key, limit, 10)
    assert limiter.size() == 4
    clock.now += 61
    await limiter.reconcile("key-a", limit, -1)
    assert limiter.size() == 3


# ---- headers ---------------------------------------------------------------------------------


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


async def test_one_of_n_workers_without_redis_enforces_its_part_of_each_limit(
    clock: Clock,
) -> None:
    """Of two workers, each admits half a key's requests per minute (and says so)."""
    worker = MemoryRateLimiter(clock=clock, share=0.5)
    limit = RateLimit(requests_per_minute=4, tokens_per_minute=None)
    decisions = [await worker.acquire("key", limit, tokens=0) for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, False]
    assert decisions[0].headers["x-ratelimit-limit-requests"] == "2"

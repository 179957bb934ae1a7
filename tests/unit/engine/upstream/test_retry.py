"""The retry budget, backoff and Retry-After on their own."""

from __future__ import annotations

import random

from sluicegate.engine.upstream.config import RetryConfig
from sluicegate.engine.upstream.retry import RetryBudget, backoff, retry_after


def test_the_retry_budget_allows_a_fifth_of_requests_after_its_burst() -> None:
    budget = RetryBudget(RetryConfig(budget=0.2, burst=2))
    assert budget.withdraw() and budget.withdraw() and not budget.withdraw()
    allowed = 0
    for _ in range(1000):
        budget.deposit()
        allowed += budget.withdraw()
    assert 195 <= allowed <= 200


def test_backoff_is_exponential_with_full_jitter() -> None:
    config = RetryConfig(backoff=0.1, backoff_max=1.0)
    rng = random.Random(7)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (5, 1.0)]:
        waits = [backoff(config, attempt, rng) for _ in range(500)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > 0.9 * ceiling and min(waits) < 0.1 * ceiling


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("3", 60) == 3.0
    assert retry_after(None, 60) is None and retry_after("soon", 60) is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 60) == 0.0  # in the past


def test_retry_after_is_finite_and_at_most_its_bound() -> None:
    for endless in ("inf", "Infinity", "1e9", "1e400", "Fri, 31 Dec 9999 23:59:59 GMT"):
        assert retry_after(endless, 60) == 60.0, endless
    assert retry_after("-inf", 60) == 0.0
    assert retry_after("nan", 60) is None
    assert retry_after("30", 5.5) == 5.5

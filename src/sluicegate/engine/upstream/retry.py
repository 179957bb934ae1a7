"""When to try a request again: a budget that bounds the extra load, and the wait."""

from __future__ import annotations

import datetime
import math
import random
from email.utils import parsedate_to_datetime

from sluicegate.engine.upstream.config import RetryConfig

RETRY_STATUSES = frozenset({429, 502, 503, 504})


class RetryBudget:
    """Each request pays `budget` of a retry into the pool (up to `burst`, which it starts
    with); each retry takes one. So over any N requests at most `burst + budget × N` are
    retried, as Envoy's and Finagle's budgets bound them, and a failing fleet is not hit by
    every request twice over. The pool fills with requests, not with time: light traffic
    gets the small reserve, not a rate of retries of its own."""

    def __init__(self, config: RetryConfig) -> None:
        self._ratio = config.budget
        self._cap = float(config.burst)
        self._tokens = self._cap

    def deposit(self) -> None:
        self._tokens = min(self._cap, self._tokens + self._ratio)

    def withdraw(self) -> bool:
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


def backoff(config: RetryConfig, attempt: int, rng: random.Random) -> float:
    """Seconds before retry number `attempt` (from 0): exponential, with full jitter."""
    return rng.uniform(0, min(config.backoff_max, config.backoff * 2**attempt))


def retry_after(value: str | None, longest: float) -> float | None:
    """A `Retry-After` header in seconds (a number of seconds or an HTTP date), at most
    `longest`: an upstream's word is trusted within bounds, so `inf` or a date years ahead
    cannot take it out of rotation for good. None when absent or not a number (NaN)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = (when - datetime.datetime.now(datetime.UTC)).total_seconds()
    if math.isnan(seconds):
        return None
    return min(longest, max(0.0, seconds))

"""Rate limits and their decisions: requests and tokens per minute, kept by GCRA (`gcra`).

Two limiters keep the state: `redis_limiter` (shared by every replica, falling back to
this replica's share when Redis does not answer) and `memory_limiter` (one process). Both
hand a `Window` to `decide`, which turns it into a `Decision` with OpenAI's headers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from sluicegate.quota import gcra


@dataclass(frozen=True, slots=True)
class RateLimit:
    requests_per_minute: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None  # None: unlimited

    def scaled(self, share: float) -> RateLimit:
        """This limit times `share` (at least 1 of each): one replica's part of it."""
        rpm, tpm = self.requests_per_minute, self.tokens_per_minute
        return RateLimit(
            None if rpm is None else max(1, math.floor(rpm * share)),
            None if tpm is None else max(1, math.floor(tpm * share)),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    limit: str | None  # "requests" or "tokens" when refused, else None
    retry_after: float  # seconds; 0 when allowed
    headers: dict[str, str]  # OpenAI's rate-limit headers
    local: bool = False
    """Decided by this replica's own share of the limit, because Redis did not answer."""


class RateLimiter(Protocol):
    async def acquire(
        self, key_id: str, limit: RateLimit, tokens: int, requests: int = 1
    ) -> Decision:
        """Count `requests` requests (one, or none: counted already) and `tokens` tokens,
        if both limits allow them."""
        ...

    async def reconcile(
        self, key_id: str, limit: RateLimit, tokens: int, local: bool = False
    ) -> None:
        """Count `tokens` more tokens, unchecked; negative gives them back. `local`: the
        request was admitted by this replica's share (`Decision.local`)."""
        ...

    async def close(self) -> None: ...


ALLOW = Decision(allowed=True, limit=None, retry_after=0.0, headers={})


class Window(NamedTuple):
    """One check's outcome, in seconds; what both limiters hand to `decide`."""

    allowed: bool
    request_debt: float
    """The requests TAT minus now, after the check: how far the key is from a full bucket."""
    token_debt: float
    request_retry: float
    token_retry: float


def format_duration(seconds: float) -> str:
    """A duration the way OpenAI writes it: "120ms", "45s", "1.5s", "6m0s"."""
    total_ms = max(0, round(seconds * 1000))
    if total_ms == 0:
        return "0s"
    if total_ms < 1000:
        return f"{total_ms}ms"
    minutes, ms = divmod(total_ms, 60_000)
    secs = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def decide(limit: RateLimit, w: Window, local: bool = False) -> Decision:
    """The decision and its headers: remaining is what may still be spent now, reset the
    time until the bucket is full again."""
    headers: dict[str, str] = {}
    rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
    if rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(rpm)
        headers["x-ratelimit-remaining-requests"] = str(gcra.remaining(w.request_debt, rpm))
        headers["x-ratelimit-reset-requests"] = format_duration(w.request_debt)
    if tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(tpm)
        headers["x-ratelimit-remaining-tokens"] = str(gcra.remaining(w.token_debt, tpm))
        headers["x-ratelimit-reset-tokens"] = format_duration(w.token_debt)
    if w.allowed:
        return Decision(True, None, 0.0, headers, local)
    retry_after = max(w.request_retry, w.token_retry)
    # A hair over a whole second (float sums) still says that second.
    headers["retry-after"] = str(max(1, math.ceil(retry_after - 1e-6)))
    which = "requests" if w.request_retry > 0 else "tokens"
    return Decision(False, which, retry_after, headers, local)


def unlimited(limit: RateLimit) -> bool:
    return limit.requests_per_minute is None and limit.tokens_per_minute is None

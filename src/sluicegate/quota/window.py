"""Rate limits and their decisions: requests and tokens per minute over a sliding window.

Every admitted request counts with its timestamp (and prompt tokens with theirs; completion
tokens are added by `reconcile` when the request finishes). A check drops what is at least
60 s old, then admits only if one more request and the prompt tokens still fit, so no 60 s
interval ever holds more than the limit. A refusal's Retry-After is the time until enough of
the oldest entries leave the window. Two limiters keep the windows: `redis_limiter` (shared
by every replica) and `memory_limiter` (one process); both decide through `decide` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

WINDOW_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class RateLimit:
    requests_per_minute: int | None = None  # None: unlimited
    tokens_per_minute: int | None = None  # None: unlimited


@dataclass(frozen=True, slots=True)
class Decision:
    allowed: bool
    limit: str | None  # "requests" or "tokens" when refused, else None
    retry_after: float  # seconds; 0 when allowed
    headers: dict[str, str]  # OpenAI's rate-limit headers


class RateLimiter(Protocol):
    async def acquire(self, key_id: str, limit: RateLimit, prompt_tokens: int) -> Decision: ...
    async def reconcile(self, key_id: str, limit: RateLimit, completion_tokens: int) -> None: ...
    async def close(self) -> None: ...


ALLOW = Decision(allowed=True, limit=None, retry_after=0.0, headers={})


class Window(NamedTuple):
    """One check's outcome, durations in seconds; what both limiters hand to `decide`."""

    allowed: bool
    requests: int
    tokens: int
    request_retry: float
    token_retry: float
    request_reset: float
    token_reset: float


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


def decide(limit: RateLimit, w: Window) -> Decision:
    headers: dict[str, str] = {}
    rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
    if rpm is not None:
        headers["x-ratelimit-limit-requests"] = str(rpm)
        headers["x-ratelimit-remaining-requests"] = str(max(0, rpm - w.requests))
        headers["x-ratelimit-reset-requests"] = format_duration(w.request_reset)
    if tpm is not None:
        headers["x-ratelimit-limit-tokens"] = str(tpm)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, tpm - w.tokens))
        headers["x-ratelimit-reset-tokens"] = format_duration(w.token_reset)
    if w.allowed:
        return Decision(allowed=True, limit=None, retry_after=0.0, headers=headers)
    retry_after = max(w.request_retry, w.token_retry)
    headers["retry-after"] = str(max(1, math.ceil(retry_after)))
    which = "requests" if w.request_retry > 0 else "tokens"
    return Decision(allowed=False, limit=which, retry_after=retry_after, headers=headers)


def unlimited(limit: RateLimit) -> bool:
    return limit.requests_per_minute is None and limit.tokens_per_minute is None

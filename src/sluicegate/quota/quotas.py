"""Which rate limit applies to which API key, and the 429 when one is used up.

The limiter (`redis_limiter` or `memory_limiter`) keeps the windows; this module picks the
limit for a key (its override, else the default), turns a refusal into `RateLimitError`,
and settles the completion tokens once a request has finished.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.errors import RateLimitError
from sluicegate.observability.metrics import RATE_LIMITED
from sluicegate.quota.window import RateLimit, RateLimiter


@dataclass
class Quotas:
    limiter: RateLimiter
    default: RateLimit = field(default_factory=RateLimit)
    overrides: dict[str, RateLimit] = field(default_factory=dict)

    def limit_for(self, key_id: str) -> RateLimit:
        return self.overrides.get(key_id, self.default)

    async def admit(self, key_id: str, prompt_tokens: int) -> dict[str, str]:
        """Count the request and its prompt tokens; return the rate-limit headers.

        Raises `RateLimitError` (429, with Retry-After) when a limit is used up.
        """
        limit = self.limit_for(key_id)
        decision = await self.limiter.acquire(key_id, limit, prompt_tokens)
        if not decision.allowed:
            RATE_LIMITED.labels(limit=decision.limit or "requests").inc()
            per_minute = (
                limit.tokens_per_minute if decision.limit == "tokens" else limit.requests_per_minute
            )
            raise RateLimitError(
                f"Rate limit reached for {decision.limit} per minute (limit {per_minute}). "
                f"Retry after {decision.headers.get('retry-after', '1')} s.",
                headers=decision.headers,
            )
        return decision.headers

    async def settle(self, key_id: str, completion_tokens: int) -> None:
        await self.limiter.reconcile(key_id, self.limit_for(key_id), completion_tokens)

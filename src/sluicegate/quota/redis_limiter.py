"""Rate limits in Redis, shared by every gateway replica; this replica's share when Redis
does not answer.

Each check is one Lua script running GCRA (`gcra`) on the Redis server's clock, over one
key per API key and limit holding its TAT. The keys have no TTL, so a `volatile-*` eviction
policy never takes them, and there are at most two per key id.

When Redis is down, slower than `op_timeout` or answers garbage, the limits do not lift:
this replica enforces `local_share` of each limit in its own memory (1/replicas keeps the
fleet at about the limit), counted in `RATE_LIMIT_LOCAL_DECISIONS`. The local state
shadows what this replica admits through Redis all along, so a fallback goes on from this
replica's recent use instead of granting a fresh burst. Redis is tried again every
`retry_interval` seconds, and used again as soon as it answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.observability.metrics import (
    RATE_LIMIT_LOCAL,
    RATE_LIMIT_LOCAL_DECISIONS,
    RATE_LIMIT_STORE_ERRORS,
)
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.quota.memory_limiter import MemoryRateLimiter
from sluicegate.quota.window import ALLOW, Decision, RateLimit, Window, decide, unlimited

logger = logging.getLogger(__name__)

WARNING_INTERVAL_SECONDS = 10.0

# Times are microseconds of server time; TATs are written with %.0f because Lua's default
# number-to-string conversion keeps only 14 significant digits. A microsecond of slack
# absorbs that rounding, so a whole minute's worth still fits.
_GCRA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local period = 60000000
"""

# KEYS: the requests TAT, the tokens TAT. ARGV: requests and tokens per minute (0: no such
# limit), the tokens to count, the requests to count (1, or 0 when counted already). Returns
# {allowed, request debt, token debt, request retry, token retry}, durations in microseconds;
# a debt is the TAT minus now, after the check.
_ACQUIRE_LUA = (
    _GCRA
    + """
local costs = {tonumber(ARGV[4]), tonumber(ARGV[3])}
local allowed, debt, retry, after = 1, {0, 0}, {0, 0}, {}
for i = 1, 2 do
  local limit = tonumber(ARGV[i])
  if limit > 0 then
    local tat = tonumber(redis.call('GET', KEYS[i]) or 0)
    if tat < now then tat = now end
    after[i] = tat + costs[i] * period / limit
    debt[i] = tat - now
    local wait = after[i] - period - now
    if wait > 1 then
      allowed = 0
      retry[i] = wait
    end
  end
end
if allowed == 1 then
  for i = 1, 2 do
    if after[i] and costs[i] > 0 then
      redis.call('SET', KEYS[i], string.format('%.0f', after[i]))
      debt[i] = after[i] - now
    end
  end
end
return {allowed, math.floor(debt[1]), math.floor(debt[2]), math.ceil(retry[1]),
  math.ceil(retry[2])}
"""
)

# KEYS: the tokens TAT. ARGV: tokens per minute, tokens to count (negative: given back).
_RECONCILE_LUA = (
    _GCRA
    + """
local tat = tonumber(redis.call('GET', KEYS[1]) or 0)
if tat < now then tat = now end
local after = tat + tonumber(ARGV[2]) * period / tonumber(ARGV[1])
if after > now then
  redis.call('SET', KEYS[1], string.format('%.0f', after))
else
  redis.call('DEL', KEYS[1])
end
return 1
"""
)

_FAILURES = (TimeoutError, OSError, RedisError)


class _MalformedReplyError(Exception):
    pass


class RedisRateLimiter:
    """GCRA in Redis, shared by every replica, with this replica's share as the fallback.

    The client belongs to the caller unless `owns_client` (then `close` closes it)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        prefix: str = "sluicegate",
        op_timeout: float = 0.05,
        local_share: float = 1.0,
        retry_interval: float = 1.0,
        owns_client: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._prefix = prefix
        # Abandoned, not cancelled, past the timeout: see `deadline`.
        self._deadline = Deadline(op_timeout)
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._reconcile = client.register_script(_RECONCILE_LUA)
        self._warning = ThrottledWarning(logger, WARNING_INTERVAL_SECONDS)
        self._local = MemoryRateLimiter(clock)
        self._share = local_share
        self._retry_interval = retry_interval
        self._owns_client = owns_client
        self._clock = clock
        self._down_until: float | None = None
        """While set: Redis failed, and is not tried again before this clock time."""

    @property
    def client(self) -> redis.asyncio.Redis:
        return self._client

    def _keys(self, key_id: str) -> list[str]:
        # The hash tag keeps both limits of a key in one Redis Cluster slot, as scripts need.
        base = f"{self._prefix}:gcra:{{{key_id}}}"
        return [f"{base}:req", f"{base}:tok"]

    async def acquire(
        self, key_id: str, limit: RateLimit, tokens: int, requests: int = 1
    ) -> Decision:
        if unlimited(limit):
            return ALLOW
        if self._skipping():
            return await self._acquire_locally(key_id, limit, tokens, requests)
        rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
        args = [rpm or 0, tpm or 0, max(0, tokens), requests]
        try:
            reply = await self._deadline.run(self._acquire(keys=self._keys(key_id), args=args))
            allowed, *durations = _parse_reply(reply)
        except (*_FAILURES, _MalformedReplyError) as exc:
            self._failed(key_id, exc)
            return await self._acquire_locally(key_id, limit, tokens, requests)
        self._answered()
        if allowed:
            self._local.charge(key_id, limit.scaled(self._share), max(0, tokens), requests)
        req_debt, tok_debt, req_retry, tok_retry = (d / 1e6 for d in durations)
        return decide(limit, Window(bool(allowed), req_debt, tok_debt, req_retry, tok_retry))

    async def reconcile(
        self, key_id: str, limit: RateLimit, tokens: int, local: bool = False
    ) -> None:
        tpm = limit.tokens_per_minute
        if tpm is None or tokens == 0:
            return
        # The shadow counted the reservation either way; Redis only when it admitted it.
        await self._local.reconcile(key_id, limit.scaled(self._share), tokens)
        if local or self._skipping():
            return
        try:
            await self._deadline.run(
                self._reconcile(keys=self._keys(key_id)[1:], args=[tpm, tokens])
            )
        except _FAILURES as exc:
            self._failed(key_id, exc)
            return
        self._answered()

    async def close(self) -> None:
        await self._local.close()
        if self._owns_client:
            await self._client.aclose()

    # ---- the fallback ---------------------------------------------------------------------

    def _skipping(self) -> bool:
        return self._down_until is not None and self._clock() < self._down_until

    async def _acquire_locally(
        self, key_id: str, limit: RateLimit, tokens: int, requests: int
    ) -> Decision:
        RATE_LIMIT_LOCAL_DECISIONS.inc()
        decision = await self._local.acquire(key_id, limit.scaled(self._share), tokens, requests)
        return Decision(
            decision.allowed, decision.limit, decision.retry_after, decision.headers, local=True
        )

    def _failed(self, key_id: str, exc: BaseException) -> None:
        RATE_LIMIT_STORE_ERRORS.inc()
        RATE_LIMIT_LOCAL.set(1)
        self._down_until = self._clock() + self._retry_interval
        self._warning.warn(
            "rate-limit store failed (%s: %s) checking %s; enforcing this replica's share "
            "(%.0f%%) of each limit until Redis answers",
            type(exc).__name__,
            exc,
            key_id,
            self._share * 100,
        )

    def _answered(self) -> None:
        if self._down_until is not None:
            self._down_until = None
            RATE_LIMIT_LOCAL.set(0)
            logger.info("rate-limit store answers again: limits are shared through Redis")


def _parse_reply(reply: Any) -> list[int]:
    if not isinstance(reply, list) or len(reply) != 5:
        raise _MalformedReplyError(f"unexpected reply {reply!r:.80}")
    if not all(isinstance(v, int) and v >= 0 for v in reply):
        raise _MalformedReplyError(f"unexpected reply {reply!r:.80}")
    return reply

"""Rate-limit windows in Redis, shared by every gateway replica.

One Lua script per check, on the Redis server's clock. The store fails open: a check that
times out or errors is allowed (and counted in `RATE_LIMIT_STORE_ERRORS`), because a broken
limiter must not take the whole gateway down.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

import redis.asyncio
from redis.exceptions import RedisError

from sluicegate.deadline import Deadline
from sluicegate.observability.metrics import RATE_LIMIT_STORE_ERRORS
from sluicegate.observability.throttled import ThrottledWarning
from sluicegate.quota.window import ALLOW, Decision, RateLimit, Window, decide, unlimited

logger = logging.getLogger(__name__)

WARNING_INTERVAL_SECONDS = 10.0
_WINDOW_US = 60_000_000
# A little longer than the window, so a key never expires while it still holds live entries.
_KEY_TTL_MS = 61_000

# Scores are microseconds of server time; numbers are formatted with %.0f because Lua's
# default number-to-string conversion keeps only 14 significant digits.
# Returns {allowed, requests, tokens, request retry, token retry, request reset, token reset},
# durations in microseconds.
_ACQUIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local rpm, tpm, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local window = tonumber(ARGV[5])
local cutoff = string.format('%.0f', now - window)
local function tokens(member) return tonumber(string.match(member, ':(%d+)$')) end
local function reset(key)
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] then return tonumber(newest[2]) + window - now end
  return 0
end

local count, req_retry, req_reset = 0, 0, 0
if rpm >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  count = redis.call('ZCARD', KEYS[1])
  if count >= rpm then
    -- the (count - rpm + 1)th oldest entry has to leave before one more request fits
    local e = redis.call('ZRANGE', KEYS[1], count - rpm, count - rpm, 'WITHSCORES')
    req_retry = window
    if e[2] then req_retry = tonumber(e[2]) + window - now end
  end
end
local used, tok_retry, tok_reset = 0, 0, 0
if tpm >= 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', cutoff)
  local entries = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  for i = 1, #entries, 2 do used = used + tokens(entries[i]) end
  if cost > tpm then
    tok_retry = window
  elseif used + cost > tpm then
    local need, freed = used + cost - tpm, 0
    for i = 1, #entries, 2 do
      freed = freed + tokens(entries[i])
      if freed >= need then
        tok_retry = tonumber(entries[i + 1]) + window - now
        break
      end
    end
  end
end

local allowed = 0
if req_retry == 0 and tok_retry == 0 then
  allowed = 1
  local score = string.format('%.0f', now)
  local member = score .. ':' .. ARGV[4]
  if rpm >= 0 then
    redis.call('ZADD', KEYS[1], score, member)
    redis.call('PEXPIRE', KEYS[1], ARGV[6])
    count = count + 1
  end
  if tpm >= 0 and cost > 0 then
    redis.call('ZADD', KEYS[2], score, member .. ':' .. ARGV[3])
    redis.call('PEXPIRE', KEYS[2], ARGV[6])
    used = used + cost
  end
end
if rpm >= 0 then req_reset = reset(KEYS[1]) end
if tpm >= 0 then tok_reset = reset(KEYS[2]) end
return {allowed, count, used, req_retry, tok_retry, req_reset, tok_reset}
"""

_RECONCILE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local score = string.format('%.0f', now)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now - tonumber(ARGV[3])))
redis.call('ZADD', KEYS[1], score, score .. ':' .. ARGV[2] .. ':' .. ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
"""


class _MalformedReplyError(Exception):
    pass


class RedisRateLimiter:
    """Sliding windows in Redis, shared by every replica. The client belongs to the caller."""

    def __init__(
        self, client: redis.asyncio.Redis, prefix: str = "sluicegate", op_timeout: float = 0.05
    ) -> None:
        self._client = client
        self._prefix = prefix
        # Abandoned, not cancelled, past the timeout: see `deadline`.
        self._deadline = Deadline(op_timeout)
        self._acquire = client.register_script(_ACQUIRE_LUA)
        self._reconcile = client.register_script(_RECONCILE_LUA)
        self._warning = ThrottledWarning(logger, WARNING_INTERVAL_SECONDS)

    def _keys(self, key_id: str) -> list[str]:
        # The hash tag keeps both windows of a key in one Redis Cluster slot, as scripts need.
        base = f"{self._prefix}:rl:{{{key_id}}}"
        return [f"{base}:req", f"{base}:tok"]

    async def acquire(self, key_id: str, limit: RateLimit, prompt_tokens: int) -> Decision:
        if unlimited(limit):
            return ALLOW
        rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
        args: list[int | str] = [
            -1 if rpm is None else rpm,
            -1 if tpm is None else tpm,
            max(0, prompt_tokens),
            secrets.token_hex(8),
            _WINDOW_US,
            _KEY_TTL_MS,
        ]
        try:
            reply = await self._deadline.run(self._acquire(keys=self._keys(key_id), args=args))
            values = _parse_reply(reply)
        except (TimeoutError, OSError, RedisError, _MalformedReplyError) as exc:
            self._failed_open(key_id, exc)
            return ALLOW
        allowed, requests, tokens, *durations = values
        req_retry, tok_retry, req_reset, tok_reset = (d / 1e6 for d in durations)
        window = Window(bool(allowed), requests, tokens, req_retry, tok_retry, req_reset, tok_reset)
        return decide(limit, window)

    async def reconcile(self, key_id: str, limit: RateLimit, completion_tokens: int) -> None:
        if limit.tokens_per_minute is None or completion_tokens <= 0:
            return
        args: list[int | str] = [completion_tokens, secrets.token_hex(8), _WINDOW_US, _KEY_TTL_MS]
        try:
            await self._deadline.run(self._reconcile(keys=self._keys(key_id)[1:], args=args))
        except (TimeoutError, OSError, RedisError) as exc:
            self._failed_open(key_id, exc)

    async def close(self) -> None:
        return None

    def _failed_open(self, key_id: str, exc: BaseException) -> None:
        RATE_LIMIT_STORE_ERRORS.inc()
        self._warning.warn(
            "rate-limit store failed (%s: %s) checking %s; allowing without limits",
            type(exc).__name__,
            exc,
            key_id,
        )


def _parse_reply(reply: Any) -> list[int]:
    if not isinstance(reply, list) or len(reply) != 7:
        raise _MalformedReplyError(f"unexpected reply {reply!r:.80}")
    if not all(isinstance(v, int) and v >= 0 for v in reply):
        raise _MalformedReplyError(f"unexpected reply {reply!r:.80}")
    return reply

"""Rate limits in this process only: for a single gateway without Redis, and for each
replica's share of the limits while Redis does not answer (see `redis_limiter`).

With several workers and no Redis, each worker enforces `share` (1/N) of every limit: the
gateway as a whole then admits about the limit, as the workers share the traffic."""

from __future__ import annotations

import time
from collections.abc import Callable

from sluicegate.quota import gcra
from sluicegate.quota.window import ALLOW, Decision, RateLimit, Window, decide, unlimited

_REQUESTS, _TOKENS = "req", "tok"


class MemoryRateLimiter:
    """GCRA in a dict: one TAT per key id and limit, dropped once its bucket is full again."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, share: float = 1.0) -> None:
        self._clock = clock
        self._share = share
        """The part of each limit this process enforces (1/N of N workers without Redis)."""
        self._tats: dict[tuple[str, str], float] = {}

    async def acquire(
        self, key_id: str, limit: RateLimit, tokens: int, requests: int = 1
    ) -> Decision:
        if unlimited(limit):
            return ALLOW
        if self._share != 1.0:
            limit = limit.scaled(self._share)
        now = self._clock()
        rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
        req_key, tok_key = (key_id, _REQUESTS), (key_id, _TOKENS)
        req = None if rpm is None else gcra.conform(self._tats.get(req_key), now, rpm, requests)
        tok = None
        if tpm is not None:
            tok = gcra.conform(self._tats.get(tok_key), now, tpm, max(0, tokens))
        allowed = (req is None or req.allowed) and (tok is None or tok.allowed)
        if allowed:
            if req is not None and requests > 0:
                self._tats[req_key] = req.tat
            if tok is not None and tokens > 0:
                self._tats[tok_key] = tok.tat
        # Refused: both TATs stay as they were, and the headers say so.
        window = Window(
            allowed,
            self._debt(req_key, now),
            self._debt(tok_key, now),
            0.0 if req is None else req.retry_after,
            0.0 if tok is None else tok.retry_after,
        )
        return decide(limit, window)

    async def reconcile(
        self, key_id: str, limit: RateLimit, tokens: int, local: bool = False
    ) -> None:
        if self._share != 1.0:
            limit = limit.scaled(self._share)
        self._adjust((key_id, _TOKENS), limit.tokens_per_minute, tokens)

    def charge(self, key_id: str, limit: RateLimit, tokens: int, requests: int = 1) -> None:
        """Count `requests` requests and `tokens` tokens admitted elsewhere, unchecked."""
        if self._share != 1.0:
            limit = limit.scaled(self._share)
        self._adjust((key_id, _REQUESTS), limit.requests_per_minute, requests)
        self._adjust((key_id, _TOKENS), limit.tokens_per_minute, tokens)

    def _adjust(self, key: tuple[str, str], per_minute: int | None, cost: int) -> None:
        if per_minute is None or cost == 0:
            return
        tat = gcra.adjusted(self._tats.get(key), self._clock(), per_minute, cost)
        if tat is None:
            self._tats.pop(key, None)
        else:
            self._tats[key] = tat

    def _debt(self, key: tuple[str, str], now: float) -> float:
        return max(0.0, self._tats.get(key, now) - now)

    def size(self) -> int:
        """How many TATs are kept (at most two per key id)."""
        return len(self._tats)

    async def close(self) -> None:
        self._tats.clear()

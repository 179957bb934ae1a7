"""Rate-limit windows in this process only, for a single gateway without Redis."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from sluicegate.quota.window import (
    ALLOW,
    WINDOW_SECONDS,
    Decision,
    RateLimit,
    Window,
    decide,
    unlimited,
)


@dataclass(slots=True)
class _KeyWindow:
    requests: deque[float] = field(default_factory=deque)
    tokens: deque[tuple[float, int]] = field(default_factory=deque)
    token_sum: int = 0

    def trim(self, cutoff: float) -> None:
        while self.requests and self.requests[0] <= cutoff:
            self.requests.popleft()
        while self.tokens and self.tokens[0][0] <= cutoff:
            self.token_sum -= self.tokens.popleft()[1]


class MemoryRateLimiter:
    """The same sliding windows in this process only, for a single gateway without Redis."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._windows: dict[str, _KeyWindow] = {}

    async def acquire(self, key_id: str, limit: RateLimit, prompt_tokens: int) -> Decision:
        if unlimited(limit):
            return ALLOW
        rpm, tpm = limit.requests_per_minute, limit.tokens_per_minute
        cost = max(0, prompt_tokens)
        now = self._clock()
        w = self._windows.setdefault(key_id, _KeyWindow())
        w.trim(now - WINDOW_SECONDS)
        req_retry = tok_retry = 0.0
        if rpm is not None and len(w.requests) >= rpm:
            blocking = len(w.requests) - rpm
            req_retry = (
                w.requests[blocking] + WINDOW_SECONDS - now
                if blocking < len(w.requests)
                else WINDOW_SECONDS
            )
        if tpm is not None and cost > tpm:
            tok_retry = WINDOW_SECONDS
        elif tpm is not None and w.token_sum + cost > tpm:
            need, freed = w.token_sum + cost - tpm, 0
            for stamp, tokens in w.tokens:
                freed += tokens
                if freed >= need:
                    tok_retry = stamp + WINDOW_SECONDS - now
                    break
        allowed = req_retry == 0 and tok_retry == 0
        if allowed:
            if rpm is not None:
                w.requests.append(now)
            if tpm is not None and cost > 0:
                w.tokens.append((now, cost))
                w.token_sum += cost
        req_reset = w.requests[-1] + WINDOW_SECONDS - now if w.requests else 0.0
        tok_reset = w.tokens[-1][0] + WINDOW_SECONDS - now if w.tokens else 0.0
        if not w.requests and not w.tokens:
            del self._windows[key_id]
        counts = Window(
            allowed, len(w.requests), w.token_sum, req_retry, tok_retry, req_reset, tok_reset
        )
        return decide(limit, counts)

    async def reconcile(self, key_id: str, limit: RateLimit, completion_tokens: int) -> None:
        if limit.tokens_per_minute is None or completion_tokens <= 0:
            return
        now = self._clock()
        w = self._windows.setdefault(key_id, _KeyWindow())
        w.trim(now - WINDOW_SECONDS)
        w.tokens.append((now, completion_tokens))
        w.token_sum += completion_tokens

    async def close(self) -> None:
        self._windows.clear()

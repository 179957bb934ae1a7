"""How long a new cache entry lives: longer when generating is cheap, shorter when it is slow.

The policy follows the engine's observed latency (an exponentially weighted average of recent
generation times). A fast engine means a busy interactive deployment where the same prompts
recur soon and entries are cheap to rebuild, so they may live longer (3x base); a slow engine
means long, bespoke generations, which go stale as prompts and models change, and whose memory
is better spent elsewhere (0.5x base). Jitter keeps entries written together from expiring
together.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TtlRule:
    base: float = 600.0
    minimum: float = 30.0
    maximum: float = 3600.0
    fast_below: float = 0.2
    slow_above: float = 0.8
    fast_factor: float = 3.0
    slow_factor: float = 0.5
    jitter: float = 0.1
    smoothing: float = 0.2
    """Weight of the newest observation in the moving average."""


class TtlPolicy:
    def __init__(self, rule: TtlRule, rng: random.Random | None = None) -> None:
        self._rule = rule
        self._latency: float | None = None
        self._rng = rng or random.Random()

    @property
    def latency(self) -> float | None:
        """The moving average of generation times, or None before the first one."""
        return self._latency

    def observe(self, seconds: float) -> None:
        a = self._rule.smoothing
        self._latency = seconds if self._latency is None else a * seconds + (1 - a) * self._latency

    def effective(self) -> float:
        """TTL in seconds for an entry written now, before jitter."""
        rule = self._rule
        factor = 1.0
        if self._latency is not None and self._latency < rule.fast_below:
            factor = rule.fast_factor
        elif self._latency is not None and self._latency > rule.slow_above:
            factor = rule.slow_factor
        return min(max(rule.base * factor, rule.minimum), rule.maximum)

    def sample_ms(self) -> int:
        """TTL for one entry, in milliseconds, jittered by up to ±`jitter` of itself."""
        ttl = self.effective()
        jitter = self._rule.jitter
        return max(1, round(1000 * ttl * self._rng.uniform(1 - jitter, 1 + jitter)))

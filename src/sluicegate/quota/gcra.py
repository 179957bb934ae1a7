"""GCRA, the generic cell rate algorithm: a rate limit kept as one number per key.

A limit of N units per minute spaces units `interval = 60 / N` seconds apart. The state is
the theoretical arrival time (TAT): when the key's bucket would be full again. A check of
`cost` units moves it to `max(TAT, now) + cost * interval`, and conforms if that lies at
most one minute ahead: so a key may spend the whole minute's N at once (the burst), then
gets one unit back every `interval`. Any interval of d seconds admits at most
N + floor(N * d / 60). Settling moves the TAT by the difference (a refund moves it back).

These are the formulas; `memory_limiter` runs them in this process and `redis_limiter`
runs the same ones in a Lua script on the Redis server's clock.
"""

from __future__ import annotations

import math
from typing import NamedTuple

PERIOD = 60.0
# Float sums of intervals (60 / 7 * 7) land a hair off; a whole minute's worth must fit.
_EPSILON = 1e-9


class Conformance(NamedTuple):
    allowed: bool
    tat: float
    """The TAT after the check: moved on when allowed, else as it was (never before now)."""
    retry_after: float
    """Seconds until the same cost would conform; 0 when allowed."""


def interval(per_minute: int) -> float:
    return PERIOD / per_minute


def conform(tat: float | None, now: float, per_minute: int, cost: int) -> Conformance:
    """Check `cost` units against a limit whose state is `tat` (None: a full bucket)."""
    base = now if tat is None or tat < now else tat
    after = base + cost * interval(per_minute)
    retry = after - PERIOD - now
    if retry > _EPSILON:
        return Conformance(False, base, retry)
    return Conformance(True, after, 0.0)


def adjusted(tat: float | None, now: float, per_minute: int, cost: int) -> float | None:
    """The TAT once `cost` more units (negative: given back) are counted, unchecked; None
    when that leaves the bucket full, so no state need be kept."""
    base = now if tat is None or tat < now else tat
    after = base + cost * interval(per_minute)
    return after if after > now else None


def remaining(debt: float, per_minute: int) -> int:
    """Whole units a key may still spend now, `debt` being its TAT minus now."""
    left = (PERIOD - max(0.0, debt)) * per_minute / PERIOD
    return max(0, min(per_minute, math.floor(left + _EPSILON)))

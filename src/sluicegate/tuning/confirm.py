"""The confirmation: the search's best against today's settings on the held-out traffic, in
pairs of runs on the same window (in alternating order: A then B, then B then A), and a
recommendation only when the gain holds with confidence.

The statistic is the geometric mean of the pairs' goodput ratios, each smoothed by half a
request (`(met + 0.5) / (met_today + 0.5)`, so that a pair where today's settings met nothing
stays finite), with a one-sided 95% lower bound from Student's t over the log ratios. The
number of pairs is fixed before the first is run: no peeking.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sluicegate.tuning.search import Config

# Student's t, one-sided 95%, by degrees of freedom (1 to 10); no scipy here.
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)


class PairedRunner(Protocol):
    async def met(self, config: Config, pair: int) -> int:
        """Requests that met the objective when `config` ran the held-out window (the same
        traffic for both configurations of pair `pair`)."""
        ...


@dataclass(frozen=True, slots=True)
class Confirmation:
    ratios: tuple[float, ...]
    ratio: float
    """The geometric mean of the pairs' goodput ratios (the best over today's)."""
    lower_bound: float

    @property
    def recommend(self) -> bool:
        return self.lower_bound > 1.0


async def confirm(
    runner: PairedRunner,
    today: Config,
    best: Config,
    pairs: int,
    fits: Callable[[], bool] | None = None,
) -> Confirmation:
    """`pairs` pairs; with `fits` (whether another pair fits the time left), fewer when the
    budget runs out, never fewer than 2: the bound, over fewer pairs, is then wider (Student's
    t for their number), so running short costs confidence, not honesty."""
    if not 2 <= pairs <= len(_T95) + 1:
        raise ValueError(f"pairs between 2 and {len(_T95) + 1}")
    if best == today:
        raise ValueError("the best is today's settings: nothing to confirm")
    ratios: list[float] = []
    for pair in range(pairs):
        if pair >= 2 and fits is not None and not fits():
            break
        order = (today, best) if pair % 2 == 0 else (best, today)
        met = {config: await runner.met(config, pair) for config in order}
        ratios.append((met[best] + 0.5) / (met[today] + 0.5))
    return summarize(ratios)


def summarize(ratios: Sequence[float]) -> Confirmation:
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n
    spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1))
    bound = mean - _T95[n - 2] * spread / math.sqrt(n)
    return Confirmation(tuple(ratios), math.exp(mean), math.exp(bound))

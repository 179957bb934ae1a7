"""The objective a tune holds the engine to, and goodput against it.

`--slo ttft_p90=2s,itl_p90=300ms`: a request meets the objective when its time to first token
is within the TTFT target and its own 90th percentile gap between tokens within the ITL
target. Goodput is the requests that met it per second of offered traffic; a request refused,
failed or timed out is a miss, so refusing wins only where the refused would have missed. A
stream still answering when a trial's replay ends is judged on what it had shown
(`Outcome.cut`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m)\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0}
TARGETS = ("ttft_p90", "itl_p90")


def parse_duration(text: str) -> float:
    """Seconds from `2s`, `300ms`, `30m`; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration (a positive number with s, ms or m)")
    return float(match.group(1)) * _UNITS[match.group(2)]


@dataclass(frozen=True, slots=True)
class Objective:
    ttft: float
    """Seconds to the first token."""
    itl: float
    """Seconds between tokens, at a request's own 90th percentile."""

    @classmethod
    def parse(cls, text: str) -> Objective:
        """From `ttft_p90=2s,itl_p90=300ms` (both targets, in any order); ValueError naming
        what is wrong."""
        targets: dict[str, float] = {}
        for part in text.split(","):
            name, _, value = part.partition("=")
            name = name.strip()
            if name not in TARGETS:
                raise ValueError(f"{name!r} is no target (targets: {', '.join(TARGETS)})")
            if name in targets:
                raise ValueError(f"{name} is given twice")
            targets[name] = parse_duration(value)
        missing = [t for t in TARGETS if t not in targets]
        if missing:
            raise ValueError(f"the objective needs {', '.join(missing)}")
        return cls(targets["ttft_p90"], targets["itl_p90"])

    def met_by(self, ttft: float | None, gaps: Sequence[float]) -> bool:
        """Whether a request that began answering after `ttft` seconds, with these gaps
        between its tokens, met the objective (None: it never answered)."""
        if ttft is None or ttft > self.ttft:
            return False
        return not gaps or percentile(gaps, 90) <= self.itl

    def missed_by(self, outcome: Outcome) -> str | None:
        """Why `outcome` missed: `start` (its first token late or never: refused, failed,
        timed out), `stream` (in time, but its gaps too long), or None: it met the
        objective."""
        if outcome.failed or outcome.refused or outcome.ttft is None or outcome.ttft > self.ttft:
            return "start"
        if outcome.gaps and percentile(outcome.gaps, 90) > self.itl:
            return "stream"
        return None


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replayed request: when it began answering and its gaps, or that it did not."""

    ttft: float | None
    gaps: tuple[float, ...] = ()
    tokens: int = 0
    refused: bool = False
    failed: bool = False
    rejected: bool = False
    """Refused as a bad request (a 4xx other than 429): the replay's fault, not the
    configuration's (a tune stops on it)."""
    cut: bool = False
    """Still answering when the replay ended (its window's end plus the drain): judged on
    what it had shown, its first token and the gaps so far. The objective bounds the first
    token and the pace, not how long a long answer takes in all; a cut stream is no failure
    (one cut before its first token missed it all the same)."""


@dataclass(frozen=True, slots=True)
class Score:
    goodput: float
    """Requests that met the objective, per offered second."""
    attainment: float
    """Their share of the requests."""
    ttft_p50: float
    ttft_p90: float
    ttft_p99: float
    itl_p90: float
    """The median of the requests' own 90th percentile gaps."""
    throughput: float
    """Output tokens per offered second."""
    refused: int
    failed: int
    met: int
    """Requests that met the objective."""
    requests: int
    """Requests judged."""
    slow_starts: int = 0
    """Misses whose first token came late or never (refused and failed included), of the
    requests heard from."""
    slow_streams: int = 0
    """Misses that began in time but whose gaps between tokens were too long."""

    @property
    def misses(self) -> int:
        return self.requests - self.met


def plausible_misses(requests: int, attainment: float = 0.9, level: float = 0.95) -> int:
    """The most misses a configuration that meets the objective for `attainment` of its
    requests shows on `requests` of them, in `level` of runs: the 95% quantile of the
    binomial (4 of 40 is what such a configuration misses on average; it misses 7 or fewer in
    19 runs of 20). Past it, a run says with that confidence that the configuration cannot
    meet the objective; at or under it, a short run cannot tell it from one that does."""
    miss = 1.0 - attainment
    seen = 0.0
    for k in range(requests + 1):
        seen += math.comb(requests, k) * miss**k * attainment ** (requests - k)
        if seen >= level - 1e-12:
            return k
    return requests


def score(
    heard: Sequence[Outcome], objective: Objective, offered_seconds: float, unheard: int = 0
) -> Score:
    """The trial's score over `offered_seconds` of replayed traffic: the requests `heard`
    from, and `unheard` more that a run stopped early never sent or never ended (misses, as
    failed, of no known cause). Percentiles of TTFT are over the requests that answered; a
    request that did not counts as a miss."""
    outcomes = [*heard, *([Outcome(None, failed=True)] * unheard)]
    if not outcomes or offered_seconds <= 0:
        raise ValueError("a score needs outcomes over some time")
    causes = [objective.missed_by(o) for o in heard]
    met = sum(objective.missed_by(o) is None for o in outcomes)
    ttfts = [o.ttft for o in outcomes if o.ttft is not None]
    itls = [percentile(o.gaps, 90) for o in outcomes if o.gaps]
    return Score(
        goodput=met / offered_seconds,
        attainment=met / len(outcomes),
        ttft_p50=percentile(ttfts, 50) if ttfts else math.inf,
        ttft_p90=percentile(ttfts, 90) if ttfts else math.inf,
        ttft_p99=percentile(ttfts, 99) if ttfts else math.inf,
        itl_p90=percentile(itls, 50) if itls else 0.0,
        throughput=sum(o.tokens for o in outcomes) / offered_seconds,
        refused=sum(o.refused for o in outcomes),
        failed=sum(o.failed for o in outcomes),
        met=met,
        requests=len(outcomes),
        slow_starts=causes.count("start"),
        slow_streams=causes.count("stream"),
    )


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank `p`th percentile (a value that occurred: no interpolation)."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]

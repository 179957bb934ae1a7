"""The search: configurations tried on windows of the profile, the weaker half dropped after
each window (successive halving), within a time budget.

A trial runs one configuration on one window of traffic (`TrialRunner`, a gateway replaying
the window in the real tool, a fake with a known optimum in the tests) and comes back scored.
Windows grow from rung to rung, so most configurations are judged on a short window and only
the best on long ones; a configuration that cannot meet the objective on a window is not
tried on the next. The budget is spent as the runner says (its clock), and a rung that does
not fit what is left is not begun.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sluicegate.tuning.objective import Score, plausible_misses

FEASIBLE_ATTAINMENT = 0.9
"""A configuration whose requests meet the objective less often than this cannot win (the
targets are 90th percentiles)."""


def allowed_misses(requests: int) -> int:
    """The misses a run of `requests` may have and still be judged able to meet the
    objective: as many as a configuration meeting it for `FEASIBLE_ATTAINMENT` of its
    requests could show (`plausible_misses`). A window of 40 requests is too short to tell
    90% from 85%, and judging it by its share alone threw out good configurations on their
    bad luck."""
    return plausible_misses(requests, FEASIBLE_ATTAINMENT)


def consistent(score: Score) -> bool:
    """Whether a run's misses are within `allowed_misses`."""
    return score.misses <= allowed_misses(score.requests)


@dataclass(frozen=True, slots=True)
class Config:
    """One point of the search: the settings it changes from today's, by setting name."""

    knobs: tuple[tuple[str, object], ...] = ()

    @classmethod
    def of(cls, knobs: Mapping[str, object]) -> Config:
        return cls(tuple(sorted(knobs.items())))

    def get(self, name: str, default: object = None) -> object:
        return dict(self.knobs).get(name, default)

    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.knobs) or "today's settings"


@dataclass(frozen=True, slots=True)
class Trial:
    config: Config
    window: int
    """The rung: which window of the profile it ran on."""
    score: Score
    seconds: float
    """What it cost, start-up included."""
    stopped_early: bool = False

    @property
    def feasible(self) -> bool:
        return not self.stopped_early and consistent(self.score)


class TrialRunner(Protocol):
    async def run(self, config: Config, window: int) -> Trial:
        """`config` on the `window`-th window of the search's traffic (0 the shortest)."""
        ...

    def cost(self, config: Config, window: int) -> float:
        """What running it would cost, in seconds (its window, a restart if it needs one)."""
        ...


@dataclass
class Budget:
    seconds: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def left(self) -> float:
        return self.seconds - (self.clock() - self.started)


@dataclass(frozen=True, slots=True)
class Outcome:
    trials: tuple[Trial, ...]
    best: Config | None
    """The best feasible configuration of the last rung it reached; None: none was."""
    out_of_time: bool = False


async def search(
    runner: TrialRunner,
    configs: Sequence[Config],
    windows: int,
    budget: Budget,
    reserve: float = 0.0,
    on_trial: Callable[[Trial], None] | None = None,
) -> Outcome:
    """Successive halving over `windows` rungs, keeping `reserve` seconds of the budget for
    what follows (the confirmation). Within a rung, what needs no restart runs first (the
    runner's cost says), and a trial that no longer fits what is left is not begun: out of
    time in a rung, the best is the last whole rung's (or, in the first, of those that ran)."""
    alive = list(dict.fromkeys(configs))
    trials: list[Trial] = []
    ranked: list[Trial] = []
    for window in range(windows):
        rung: list[Trial] = []
        out_of_time = False
        for config in sorted(alive, key=lambda c: runner.cost(c, window)):
            if runner.cost(config, window) > budget.left() - reserve:
                out_of_time = True
                break
            trial = await runner.run(config, window)
            trials.append(trial)
            rung.append(trial)
            if on_trial is not None:
                on_trial(trial)
        if out_of_time:
            best = _best(ranked) if ranked else _best(sorted(rung, key=_rank))
            return Outcome(tuple(trials), best, out_of_time=True)
        ranked = sorted(rung, key=_rank)
        feasible = [t for t in ranked if t.feasible]
        if not feasible:
            return Outcome(tuple(trials), None)
        alive = [t.config for t in feasible[: max(1, math.ceil(len(feasible) / 2))]]
        if len(alive) == 1:
            # One left: its longer windows would tell nothing more than the confirmation.
            break
    return Outcome(tuple(trials), _best(ranked))


def _rank(trial: Trial) -> tuple[bool, float, float]:
    """Feasible first, then more goodput, then a shorter P90 TTFT."""
    return (not trial.feasible, -trial.score.goodput, trial.score.ttft_p90)


def _best(ranked: Sequence[Trial]) -> Config | None:
    return next((t.config for t in ranked if t.feasible), None)

"""The search against a fake trial runner with a known optimum (no engine): it finds the
optimum, halves the field each window, tries what needs no restart first, keeps its budget
and what it reserved, and stops when nothing can meet the objective."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluicegate.tuning.objective import Score
from sluicegate.tuning.search import Budget, Config, Trial, search

GRID = [
    Config.of({"max_num_seqs": seqs, "max_num_batched_tokens": batched})
    for seqs in (8, 16, 32, 64)
    for batched in (2048, 4096, 8192)
]
BEST = Config.of({"max_num_seqs": 32, "max_num_batched_tokens": 4096})
WINDOW_SECONDS = (20.0, 40.0, 80.0)
RESTART = 30.0


def _score(goodput: float, attainment: float) -> Score:
    return Score(goodput, attainment, 1.0, 1.5, 2.0, 0.1, 100.0, 0, 0, round(attainment * 40), 40)


@dataclass
class FakeRunner:
    """Goodput falls with the distance from `BEST`; a restart costs `RESTART` unless the
    configuration is the one running. Its clock moves by what each trial costs."""

    now: float = 0.0
    running: Config | None = None
    ran: list[tuple[Config, int]] = field(default_factory=list)
    attainment: float = 0.95

    def clock(self) -> float:
        return self.now

    def cost(self, config: Config, window: int) -> float:
        return WINDOW_SECONDS[window] + (0.0 if config == self.running else RESTART)

    async def run(self, config: Config, window: int) -> Trial:
        seconds = self.cost(config, window)
        self.now += seconds
        self.running = config
        self.ran.append((config, window))
        seqs, batched = config.get("max_num_seqs"), config.get("max_num_batched_tokens")
        assert isinstance(seqs, int) and isinstance(batched, int)
        distance = abs(seqs - 32) / 8 + abs(batched - 4096) / 2048
        return Trial(config, window, _score(10.0 - distance, self.attainment), seconds)


async def test_the_search_finds_the_optimum_halving_the_field() -> None:
    runner = FakeRunner()
    outcome = await search(runner, GRID, 3, Budget(3600, runner.clock))
    assert outcome.best == BEST and not outcome.out_of_time
    per_window = [sum(1 for _, w in runner.ran if w == window) for window in range(3)]
    assert per_window == [12, 6, 3]


async def test_what_needs_no_restart_runs_first() -> None:
    runner = FakeRunner(running=GRID[5])
    await search(runner, GRID, 1, Budget(3600, runner.clock))
    assert runner.ran[0] == (GRID[5], 0)


async def test_the_budget_and_its_reserve_are_kept() -> None:
    runner = FakeRunner()
    # The first rung costs 12 x 50 = 600 s; of the second (6 x 70 s) only 4 fit in 900 s.
    outcome = await search(runner, GRID, 3, Budget(1200, runner.clock), reserve=300)
    assert outcome.out_of_time and runner.now <= 1200 - 300
    assert [w for _, w in runner.ran].count(1) == 4
    assert outcome.best == BEST  # the best of the last whole rung


async def test_a_budget_short_of_a_whole_rung_still_tries_the_cheapest_first() -> None:
    """Settings that need no restart (the running configuration) before the others, and as
    many as fit."""
    runner = FakeRunner(running=GRID[0])
    outcome = await search(runner, GRID, 3, Budget(130, runner.clock))
    assert runner.ran == [(GRID[0], 0), (GRID[1], 0), (GRID[2], 0)]
    assert outcome.out_of_time and outcome.best == GRID[1]  # the nearest the optimum


async def test_a_trial_that_costs_more_than_its_estimate_cannot_overrun_the_next() -> None:
    runner = FakeRunner()
    real = runner.run

    async def slow(config: Config, window: int) -> Trial:
        runner.now += 100.0  # each trial takes 100 s more than its estimate
        return await real(config, window)

    runner.run = slow  # type: ignore[method-assign]
    await search(runner, GRID, 3, Budget(600, runner.clock))
    assert len(runner.ran) == 4 and runner.now <= 600


async def test_nothing_feasible_ends_the_search_with_no_best() -> None:
    runner = FakeRunner(attainment=0.5)
    outcome = await search(runner, GRID, 3, Budget(3600, runner.clock))
    assert outcome.best is None and len(outcome.trials) == 12


def test_a_short_run_is_judged_by_what_it_can_tell() -> None:
    """33 of 40 met (82.5%) is within what a configuration meeting the objective 90% of the
    time shows by chance; 32 of 40 is not; a run stopped early is never feasible."""
    config = Config()
    assert Trial(config, 0, _score(1.0, 33 / 40), 20.0).feasible
    assert not Trial(config, 0, _score(1.0, 32 / 40), 20.0).feasible
    assert not Trial(config, 0, _score(1.0, 1.0), 20.0, stopped_early=True).feasible

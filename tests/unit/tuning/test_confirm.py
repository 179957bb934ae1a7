"""The confirmation: pairs in alternating order on the same window, the geometric mean of
their smoothed ratios with a one-sided 95% lower bound, a recommendation only above 1."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from sluicegate.tuning.confirm import confirm, summarize
from sluicegate.tuning.search import Config

TODAY, BEST = Config(), Config.of({"max_num_seqs": 32})


@dataclass
class FakePairs:
    today: list[int]
    best: list[int]
    order: list[tuple[int, Config]] = field(default_factory=list)

    async def met(self, config: Config, pair: int) -> int:
        self.order.append((pair, config))
        return (self.best if config == BEST else self.today)[pair]


async def test_pairs_alternate_and_a_clear_gain_is_recommended() -> None:
    runner = FakePairs(today=[40, 42, 41, 39], best=[50, 51, 49, 50])
    result = await confirm(runner, TODAY, BEST, 4)
    assert [c for _, c in runner.order] == [TODAY, BEST, BEST, TODAY, TODAY, BEST, BEST, TODAY]
    assert [p for p, _ in runner.order] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert result.recommend and result.ratio > 1.15


async def test_no_gain_keeps_todays_settings() -> None:
    result = await confirm(FakePairs([40, 45, 38], [41, 39, 44]), TODAY, BEST, 3)
    assert not result.recommend


def test_the_bound_is_students_t_over_the_log_ratios() -> None:
    ratios = [1.2, 1.1, 1.3]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    result = summarize(ratios)
    assert result.ratio == pytest.approx(math.exp(mean))
    assert result.lower_bound == pytest.approx(math.exp(mean - 2.920 * sd / math.sqrt(3)))


async def test_a_pair_where_today_met_nothing_stays_finite() -> None:
    result = await confirm(FakePairs([0, 0], [5, 6]), TODAY, BEST, 2)
    assert math.isfinite(result.ratio) and result.ratio == pytest.approx(math.sqrt(11 * 13))
    with pytest.raises(ValueError):
        await confirm(FakePairs([1, 1], [1, 1]), TODAY, TODAY, 2)

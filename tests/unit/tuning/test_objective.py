"""The objective and goodput: a request meets it by its own TTFT and its own 90th percentile
gap; refusals and failures are misses; percentiles are nearest-rank."""

from __future__ import annotations

import math

import pytest

from sluicegate.tuning.objective import (
    Objective,
    Outcome,
    parse_duration,
    percentile,
    plausible_misses,
    score,
)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2s", 2.0), ("300ms", 0.3), ("1.5 s", 1.5), ("30m", 1800.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["2", "0s", "-1s", "2h", "fast"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_objective_takes_both_targets_in_any_order() -> None:
    assert Objective.parse("itl_p90=300ms,ttft_p90=2s") == Objective(2.0, 0.3)
    for bad, words in [
        ("ttft_p90=2s", "needs itl_p90"),
        ("ttft_p90=2s,itl_p90=1s,ttft_p90=3s", "twice"),
        ("ttft_p95=2s,itl_p90=1s", "no target"),
        ("ttft_p90=soon,itl_p90=1s", "not a duration"),
    ]:
        with pytest.raises(ValueError, match=words):
            Objective.parse(bad)


def test_a_request_meets_it_by_its_own_ttft_and_p90_gap() -> None:
    objective = Objective(2.0, 0.3)
    assert objective.met_by(1.9, [0.1] * 9 + [5.0])  # one slow gap in ten: its p90 is 0.1
    assert not objective.met_by(1.9, [0.1] * 8 + [5.0, 5.0])
    assert not objective.met_by(2.1, [0.1])
    assert not objective.met_by(None, [])
    assert objective.met_by(0.5, [])  # one token: no gap to judge


def test_goodput_counts_misses_of_every_kind() -> None:
    objective = Objective(1.0, 0.2)
    outcomes = [
        Outcome(0.5, (0.1, 0.1), tokens=3),
        Outcome(0.9, (0.1,), tokens=2),
        Outcome(1.5, (0.1,), tokens=2),  # too slow to start
        Outcome(None, refused=True),
        Outcome(None, failed=True),
        Outcome(0.5, (0.1,), tokens=1, failed=True),  # failed after a good start: a miss
        Outcome(0.5, (0.1,), tokens=2, cut=True),  # cut by the replay's end, at pace: met
        Outcome(0.5, (0.3,), tokens=2, cut=True),  # cut, too slow so far: a miss
        Outcome(None, cut=True),  # cut before its first token
    ]
    result = score(outcomes, objective, offered_seconds=10.0)
    assert result.goodput == pytest.approx(0.3) and result.attainment == pytest.approx(3 / 9)
    assert (result.refused, result.failed, result.met, result.requests) == (1, 2, 3, 9)
    assert (result.slow_starts, result.slow_streams) == (5, 1)
    assert result.throughput == pytest.approx(1.2)
    assert (result.ttft_p50, result.ttft_p90) == (0.5, 1.5)
    nothing = score([Outcome(None, refused=True)], objective, 1.0)
    assert nothing.goodput == 0 and nothing.ttft_p90 == math.inf


def test_each_miss_has_its_cause_and_the_unheard_have_none() -> None:
    objective = Objective(1.0, 0.2)
    assert objective.missed_by(Outcome(0.5, (0.1, 0.1, 0.3))) == "stream"  # nearest rank: 0.3
    assert objective.missed_by(Outcome(0.5, (0.1,) * 9 + (0.3,))) is None
    assert objective.missed_by(Outcome(0.5, (0.1,) * 8 + (0.3, 0.3))) == "stream"
    assert objective.missed_by(Outcome(1.5, (0.1,))) == "start"
    assert objective.missed_by(Outcome(None, refused=True)) == "start"
    assert objective.missed_by(Outcome(0.5, (0.5,), failed=True)) == "start"
    heard = [Outcome(0.5, (0.1,)), Outcome(0.5, (0.5,)), Outcome(2.0, (0.1,))]
    result = score(heard, objective, offered_seconds=5.0, unheard=3)
    assert (result.met, result.requests, result.failed) == (1, 6, 3)
    assert (result.slow_starts, result.slow_streams) == (1, 1)
    assert result.misses == 5


def test_the_misses_a_configuration_meeting_the_objective_may_show() -> None:
    """The 95% quantile of the binomial: one meeting it for 90% of its requests misses 4 of
    40 on average, and more than 7 in fewer than one run of 20."""
    assert [plausible_misses(n) for n in (10, 40, 80, 160)] == [3, 7, 13, 22]
    for n in (10, 40, 80, 160):
        k = plausible_misses(n)
        tail = sum(math.comb(n, j) * 0.1**j * 0.9 ** (n - j) for j in range(k + 1, n + 1))
        short = sum(math.comb(n, j) * 0.1**j * 0.9 ** (n - j) for j in range(k, n + 1))
        assert tail <= 0.05 < short, n
    assert plausible_misses(40, attainment=1.0) == 0


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 11))
    assert [percentile(values, p) for p in (10, 50, 90, 99, 100)] == [1, 5, 9, 10, 10]

"""The load test's plan and workload (bench/ramp.py, bench/k6/workload.json)."""

from __future__ import annotations

import itertools
import json

import pytest
from bench.ramp import WORKLOAD, parse_args, percentile, plan, user_start_times


@pytest.fixture
def workload() -> dict[str, object]:
    return dict(json.loads(WORKLOAD.read_text()))


def test_the_ramp_steps_up_to_the_peak_and_holds_5_minutes_in_all(
    workload: dict[str, object],
) -> None:
    steps = plan(workload, peak=16, scale=1.0)
    assert [step.concurrency for step in steps] == [4, 8, 12, 16]
    assert sum(step.seconds - step.ramp for step in steps) == 300
    assert all(a.end == b.start for a, b in itertools.pairwise(steps))


def test_scale_shortens_every_step_alike(workload: dict[str, object]) -> None:
    full, short = plan(workload, peak=16, scale=1.0), plan(workload, peak=16, scale=0.1)
    assert [s.seconds * 0.1 for s in full] == pytest.approx([s.seconds for s in short])


def test_users_join_during_the_ramp_of_their_step(workload: dict[str, object]) -> None:
    steps = plan(workload, peak=8, scale=1.0)
    starts = user_start_times(steps)
    assert len(starts) == 8
    assert starts == sorted(starts)
    for number, start in enumerate(starts):
        step = next(s for s in steps if number < s.concurrency)
        assert step.start < start <= step.start + step.ramp


def test_a_small_peak_still_runs_one_user_per_step(workload: dict[str, object]) -> None:
    assert [step.concurrency for step in plan(workload, peak=1, scale=1.0)] == [1, 1, 1, 1]


def test_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 95) == 3.0
    assert percentile([], 95) is None


def test_every_conversation_asks_the_model_something(workload: dict[str, object]) -> None:
    mix = workload["mix"]
    assert isinstance(mix, list)
    assert {kind["kind"] for kind in mix} == {"short_qa", "long_context", "multi_turn"}
    for kind in mix:
        assert kind["weight"] > 0 and kind["conversations"]
        for messages in kind["conversations"]:
            assert messages[-1]["role"] == "user"
            assert {m["role"] for m in messages} <= {"system", "user", "assistant"}
    turns = [len(c) for kind in mix if kind["kind"] == "multi_turn" for c in kind["conversations"]]
    assert min(turns) >= 4


def test_the_runner_refuses_a_meaningless_plan() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--peak", "0"])
    args = parse_args(["--base-url", "http://gw:8000", "--api-key", "k", "--scale", "0.1"])
    assert (args.base_url, args.api_key, args.scale, args.peak) == ("http://gw:8000", "k", 0.1, 16)

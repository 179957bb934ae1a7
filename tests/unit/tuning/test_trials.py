"""Trials on gateways (the fake engine's apps over loopback, behind a fake of the process
handle): admission-only configurations run on today's gateway with their bounds set through
the real `PUT /admin/admission` and today's put back after; an engine configuration gets a
gateway of its own (today's frozen meanwhile, the new one stopped after); a trial that can no
longer meet the objective stops early; the confirmation keeps both gateways and freezes the
idle one."""

from __future__ import annotations

import pytest

from sluicegate.tuning.gateways import GatewayFailed, busy
from sluicegate.tuning.objective import Objective
from sluicegate.tuning.profile import Profile, Request, split_in_time
from sluicegate.tuning.search import Config, allowed_misses
from sluicegate.tuning.trials import WARM_UP, GatewayTrials, busiest
from tests.support.fakes import FakeEngine
from tests.support.tune_gateways import BOUNDS, FakeGateway, gateways


def traffic(count: int = 40, span: float = 0.8) -> Profile:
    return Profile(
        tuple(
            Request(round(i * span / count, 4), 12, 3, 3, True, "chat", 0, "MISS", "length", ())
            for i in range(count)
        )
    )


def trials(today: FakeGateway, launched: list[FakeGateway], objective: Objective) -> GatewayTrials:
    queue = list(launched)

    async def launch(engine: Config, name: str) -> FakeGateway:
        gateway = queue.pop(0)
        gateway.events.append(f"launched {engine.label()} as {name}")
        return gateway

    search_part, held_out = split_in_time(traffic())
    return GatewayTrials(
        launch=launch,
        today=today,
        today_bounds=dict(BOUNDS),
        search_part=search_part,
        held_out=held_out,
        objective=objective,
        vocabulary=range(10, 900),
    )


def test_the_busiest_window_is_found_and_rebased() -> None:
    times = [0.0, 5.0, 10.0, 10.5, 11.0, 11.5, 30.0]
    requests = [Request(t, 4, 1, 1, True, "chat", 0, "MISS", "stop", ()) for t in times]
    chosen = busiest(requests, 2.0)
    assert [r.t for r in chosen] == [0.0, 0.5, 1.0, 1.5]
    assert len(busiest(requests, 100.0)) == len(requests)
    assert busiest([], 10.0) == []
    # Too few in the busiest seconds: the shortest span that holds enough.
    assert [r.t for r in busiest(requests, 2.0, at_least=5)] == [0.0, 5.0, 5.5, 6.0, 6.5]


async def test_admission_trials_run_on_todays_gateway_and_put_its_bounds_back() -> None:
    with gateways(FakeEngine()) as (today,):
        runner = trials(today, [], Objective(5.0, 5.0))
        trial = await runner.run(Config.of({"ttft_objective": 1.5}), 0)
    # Today's bounds for its prime, the trial's for its run, today's put back after.
    assert today.bounds == [BOUNDS, {**BOUNDS, "ttft_objective": 1.5}, BOUNDS]
    assert "freeze" not in today.events and not trial.stopped_early
    assert trial.score.attainment == 1.0 and trial.feasible
    (row,) = runner.rows
    assert row.stage == "search" and row.requests == len(runner.window(0)) == 30
    # Its measurements forgotten and a burst of warm-up requests answered before the run.
    assert today.events == ["forget"]
    assert len(today.engine.prompts) == 2 * WARM_UP + 30
    # In that order: forgotten, today's bounds, the burst, the trial's bounds, the window.
    primed = 2 * WARM_UP
    assert today.history == [
        ("forget", 0),
        ("bounds", 0),
        ("bounds", primed),
        ("bounds", primed + 30),
    ]


async def test_an_engine_trial_gets_its_own_gateway_and_today_waits_frozen() -> None:
    with gateways(FakeEngine(), FakeEngine()) as (today, other):
        runner = trials(today, [other], Objective(5.0, 5.0))
        config = Config.of({"max_num_seqs": 16, "ttft_objective": 2.0})
        await runner.run(config, 0)
    assert other.events == ["launched max_num_seqs=16 as trial-1", "forget", "stop"]
    assert today.events == ["freeze", "thaw"]
    assert today.seen == [("g1", ("g0",))] * 2  # its prime's bounds and its run's
    # Primed under today's bounds, run under the trial's; a trial gateway is not reused.
    assert other.bounds == [BOUNDS, {**BOUNDS, "ttft_objective": 2.0}]
    # A new gateway is warmed up with a few of the traffic's requests one at a time, then
    # primed as every gateway is before every run.
    assert len(other.engine.prompts) == 3 * WARM_UP + 30 and not today.engine.prompts


async def test_a_trial_that_can_no_longer_meet_the_objective_stops_early() -> None:
    # Every answer takes about 0.3 s to start, the objective wants 0.05 s: each request misses,
    # and past 6 misses of 30 (`plausible_misses`) the trial is stopped with most of its
    # window never sent.
    with gateways(FakeEngine(delays=[0.3, 0.0, 0.0])) as (today,):
        runner = trials(today, [], Objective(0.05, 5.0))
        trial = await runner.run(Config(), 0)
    assert trial.stopped_early and not trial.feasible
    assert trial.score.attainment == 0.0
    assert len(today.engine.prompts) < 30
    assert today.bounds[-1] == BOUNDS


async def test_the_confirmation_keeps_both_gateways_and_freezes_the_idle_one() -> None:
    with gateways(FakeEngine(), FakeEngine()) as (today, other):
        runner = trials(today, [other], Objective(5.0, 5.0))
        best = Config.of({"max_num_seqs": 16})
        for pair in range(2):
            for config in (Config(), best) if pair == 0 else (best, Config()):
                assert await runner.met(config, pair) == 10
        await runner.close()
    # Launched once for all the pairs, stopped at the end; whichever ran, the other was frozen
    # (the first run's, before the candidate existed, had none to freeze).
    assert other.events[0] == "launched max_num_seqs=16 as candidate"
    assert (
        other.events[-1] == "stop"
        and other.events.count("launched max_num_seqs=16 as candidate") == 1
    )
    # (three bounds set for each of today's runs: its prime's, its run's and after it; two for
    # the candidate's)
    assert today.seen == [
        *[("g0", ())] * 3, *[("g1", ("g0",))] * 4, *[("g0", ("g1",))] * 3,
    ]  # fmt: skip
    assert [(r.stage, r.round, r.arm) for r in runner.rows] == [
        ("confirm", 0, "today"), ("confirm", 0, "candidate"),
        ("confirm", 1, "candidate"), ("confirm", 1, "today"),
    ]  # fmt: skip
    # Each arm primed before each of its runs (the candidate warmed once before that).
    assert today.events.count("forget") == other.events.count("forget") == 2
    assert len(other.engine.prompts) - WARM_UP - 4 * WARM_UP == 20
    assert len(today.engine.prompts) - 4 * WARM_UP == 20


async def test_each_run_draws_its_prompts_anew() -> None:
    with gateways(FakeEngine()) as (today,):
        runner = trials(today, [], Objective(5.0, 5.0))
        await runner.run(Config(), 0)
        await runner.run(Config(), 0)
    primed = 2 * WARM_UP
    prompts = today.engine.prompts
    first, second = prompts[primed : primed + 30], prompts[2 * primed + 30 :]
    assert [len(p.ids) for p in first] == [len(p.ids) for p in second]
    assert all(a.ids != b.ids for a, b in zip(first, second, strict=True))


def test_the_work_not_done_is_read_off_the_metrics() -> None:
    exposition = (
        "# HELP sluicegate_requests_in_flight Inference requests being served\n"
        "# TYPE sluicegate_requests_in_flight gauge\n"
        'sluicegate_requests_in_flight{model="a"} 2.0\n'
        'sluicegate_requests_in_flight{model=""} 1.0\n'
        'sluicegate_requests_in_flight_other{model="a"} 7.0\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 4.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0\n'
        'vllm:num_requests_waiting_by_reason{engine="0"} 9.0\n'
    )
    assert busy(exposition) == 8.0
    assert busy("") == 0.0


def test_a_run_stops_past_the_misses_a_configuration_meeting_the_objective_may_show() -> None:
    assert [allowed_misses(n) for n in (9, 10, 40, 80, 160, 41)] == [3, 3, 7, 13, 22, 7]


async def test_a_candidate_that_does_not_start_is_a_failed_trial_and_today_goes_on() -> None:
    with gateways(FakeEngine()) as (today,):
        runner = trials(today, [], Objective(5.0, 5.0))

        async def fails(engine: Config, name: str) -> FakeGateway:
            raise GatewayFailed("it did not start (see trial.log)")

        runner.launch = fails
        trial = await runner.run(Config.of({"tensor_parallel_size": 3}), 0)
        assert not trial.feasible and trial.score.attainment == 0.0
        assert today.events == ["freeze", "thaw"]


def prioritized(count: int = 40) -> Profile:
    return Profile(
        tuple(
            Request(i * 0.02, 12, 3, 3, True, "chat", -5 if i % 2 else 5, "MISS", "length", ())
            for i in range(count)
        )
    )


async def test_priorities_go_only_to_an_engine_that_schedules_by_them() -> None:
    with gateways(FakeEngine()) as (today,):
        runner = trials(today, [], Objective(5.0, 5.0))
        runner.search_part, runner.held_out = split_in_time(prioritized())
        await runner.run(Config(), 0)  # first come, first served: none sent
        assert set(today.engine.priorities) == {0}
        # A gateway that does not take them rejects them: the replay is at fault, and says so.
        runner.scheduling_policy = "priority"
        with pytest.raises(GatewayFailed, match=r"rejected \d+ replayed requests"):
            await runner.run(Config(), 0)


async def test_every_run_on_todays_gateway_starts_from_forgotten_measurements() -> None:
    """Today's gateway runs the whole search: before each run its admission measurements are
    forgotten and it answers the same burst, so that no run's TTFT estimate is what the run
    before it taught (a run stopped early once made the next refuse a third of its window)."""
    with gateways(FakeEngine(delays=[0.3, 0.0, 0.0]), FakeEngine()) as (today, other):
        runner = trials(today, [other], Objective(0.05, 5.0))
        await runner.run(Config(), 0)  # stopped early: its requests cancelled
        await runner.run(Config.of({"ttft_objective": 1.5}), 0)
        await runner.run(Config.of({"max_num_seqs": 16}), 0)
    assert today.events == ["forget", "forget", "freeze", "thaw"]
    assert other.events.count("forget") == 1

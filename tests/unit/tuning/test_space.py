"""What a tune searches: admission bounds (no restart) around today's settings, one engine
knob at a time, prefix caching only for traffic that shares prefixes, the scheduling policy
only for traffic with priorities, GPU knobs only on GPU hosts; nothing at today's value."""

from __future__ import annotations

from sluicegate.tuning.profile import Profile, Request
from sluicegate.tuning.search import Config
from sluicegate.tuning.space import SearchSpace, admission_part, engine_part, needs_restart

TODAY: dict[str, object] = {
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "long_prefill_token_threshold": 0,
    "enable_prefix_caching": True,
    "scheduling_policy": "fcfs",
    "ttft_objective": None,
    "max_engine_running": None,
    "gpu_memory_utilization": 0.9,
    "tensor_parallel_size": 1,
}


def profile(shared: bool, priorities: bool, longest: int = 64) -> Profile:
    requests = [
        Request(
            float(i),
            longest if i == 7 else 64,
            8,
            8,
            True,
            "chat",
            i % 2 if priorities else 0,
            "MISS",
            "stop",
            (1, 2, 3 + i) if shared else (3 * i + 1, 3 * i + 2, 3 * i + 3),
        )
        for i in range(20)
    ]
    return Profile(tuple(requests))


def names(configs: tuple[Config, ...]) -> set[str]:
    return {name for config in configs for name, _ in config.knobs}


def test_admission_first_today_then_one_bound_each_scaled_to_the_target() -> None:
    space = SearchSpace.for_host(profile(False, False), TODAY, ttft_target=2.0)
    assert space.admission[0] == Config()
    assert {c.get("ttft_objective") for c in space.admission[1:4]} == {1.0, 1.5, 2.0}
    assert {c.get("max_engine_running") for c in space.admission[4:]} == {16, 32}
    assert all(len(c.knobs) == 1 for c in space.admission[1:])
    assert not any(needs_restart(c) for c in space.admission)
    assert all(needs_restart(c) for c in space.engine)


def test_engine_knobs_follow_the_traffic_and_the_host() -> None:
    plain = SearchSpace.for_host(profile(False, False), TODAY, 2.0)
    assert names(plain.engine) == {"max_num_seqs", "max_num_batched_tokens"}
    shared = SearchSpace.for_host(profile(True, True), TODAY, 2.0)
    assert Config.of({"enable_prefix_caching": False}) in shared.engine
    assert Config.of({"scheduling_policy": "priority"}) in shared.engine
    gpu = SearchSpace.for_host(profile(False, False), TODAY, 2.0, gpus=4)
    assert {c.get("tensor_parallel_size") for c in gpu.engine} - {None} == {2, 4}
    assert {c.get("gpu_memory_utilization") for c in gpu.engine} - {None} == {0.85, 0.95}


def test_a_prefill_bound_is_searched_only_below_the_longest_prompt() -> None:
    """Above every prompt's length, `long_prefill_token_threshold` would bound nothing."""
    for longest, bounds in ((64, set()), (256, {128}), (600, {128, 256, 512})):
        space = SearchSpace.for_host(profile(False, False, longest), TODAY, 2.0)
        found = {c.get("long_prefill_token_threshold") for c in space.engine} - {None}
        assert found == bounds, longest


def test_a_step_to_todays_value_is_no_step() -> None:
    today = {**TODAY, "max_num_seqs": 32, "max_num_batched_tokens": 2048}
    space = SearchSpace.for_host(profile(False, False), today, 2.0)
    assert Config.of({"max_num_seqs": 32}) not in space.engine
    assert Config.of({"max_num_batched_tokens": 2048}) not in space.engine
    assert len(set(space.engine)) == len(space.engine) == 6


def test_the_second_stage_keeps_the_first_stages_bounds_on_every_engine_step() -> None:
    space = SearchSpace.for_host(profile(False, False), TODAY, 2.0)
    bounds = Config.of({"ttft_objective": 1.5})
    configs = space.engine_with(bounds)
    assert configs[0] == bounds
    assert all(c.get("ttft_objective") == 1.5 for c in configs)
    assert [engine_part(c) for c in configs[1:]] == list(space.engine)
    assert {admission_part(c) for c in configs} == {bounds}
    assert space.engine_with(Config())[0] == Config()


def test_every_knob_gets_a_step_before_any_gets_a_second() -> None:
    """A budget that runs out in the first window has tried each knob once."""
    space = SearchSpace.for_host(profile(True, True, longest=600), TODAY, 2.0)
    first = [name for config in space.engine[:5] for name, _ in config.knobs]
    assert first == [
        "max_num_seqs",
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "enable_prefix_caching",
        "scheduling_policy",
    ]
    assert [c.get("max_num_seqs") for c in space.engine if c.get("max_num_seqs")] == [8, 16, 32, 64]


def test_slow_streams_put_the_steps_that_bound_a_steps_work_first() -> None:
    """The prefill bound (it delays only long prompts), then fewer tokens a step, then fewer
    sequences; every step still tried, each once."""
    space = SearchSpace.for_host(profile(True, False, longest=600), TODAY, 2.0)
    bounds = Config.of({"ttft_objective": 1.5})
    smoothing = space.engine_with(bounds, slow_streams=True)
    assert smoothing[0] == bounds
    assert [engine_part(c) for c in smoothing[1:4]] == [
        Config.of({"long_prefill_token_threshold": 128}),
        Config.of({"max_num_batched_tokens": 1024}),
        Config.of({"max_num_seqs": 8}),
    ]
    assert sorted(map(str, smoothing)) == sorted(map(str, space.engine_with(bounds)))
    assert smoothing[-1] == Config.of({"enable_prefix_caching": False, "ttft_objective": 1.5})


def test_a_step_above_todays_value_does_not_count_as_bounding_work() -> None:
    today = {**TODAY, "max_num_seqs": 16, "max_num_batched_tokens": 2048}
    space = SearchSpace.for_host(profile(False, False, longest=600), today, 2.0)
    first = space.smoothing_first
    bounding = [
        c for c in first if c.get("max_num_seqs") == 8 or c.get("max_num_batched_tokens") == 1024
    ]
    assert all(first.index(c) < first.index(Config.of({"max_num_seqs": 32})) for c in bounding)
    assert first.index(Config.of({"max_num_batched_tokens": 4096})) > first.index(
        Config.of({"max_num_seqs": 8})
    )

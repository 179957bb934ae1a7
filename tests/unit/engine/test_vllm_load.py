"""The in-process engine's load (`engine.vllm_load`): what vLLM's scheduler stats say after
each step, as vLLM's output handler passes them to a stat logger, and how the adapter corrects
them between steps. vLLM's own stats classes are used; the engine is not run here (the
integration tests run it)."""

from __future__ import annotations

import pytest
from vllm.v1.metrics.stats import IterationStats, PrefillStats, SchedulerStats

from sluicegate.counters import Board
from sluicegate.engine.protocol import EngineLoad
from sluicegate.engine.vllm_engine import VLLMEngine
from sluicegate.engine.vllm_load import LoadMeter
from tests.support.clock import Clock


def stats(waiting: int, running: int, kv: float, skipped: int = 0) -> SchedulerStats:
    return SchedulerStats(
        num_running_reqs=running,
        num_waiting_reqs=waiting,
        num_skipped_waiting_reqs=skipped,
        kv_cache_usage=kv,
    )


def iteration(prompt_tokens: int) -> IterationStats:
    """A step's stats as vLLM's output processor fills them in, `prompt_tokens` prefilled."""
    step = IterationStats()
    if prompt_tokens:
        step.prompt_token_stats.update_from_output(
            PrefillStats(num_prompt_tokens=prompt_tokens, num_computed_tokens=prompt_tokens)
        )
    return step


def test_the_logger_vllm_calls_keeps_the_latest_scheduler_state() -> None:
    meter = LoadMeter(clock=Clock())  # no time passes: no step time
    logger = meter.logger(None, 0)  # type: ignore[arg-type]
    logger.record(stats(3, 5, 0.25, skipped=1), None)
    assert meter.load() == EngineLoad(waiting=4, running=5, kv_cache_usage=0.25)
    logger.record(None, None)  # a step without scheduler stats changes nothing
    logger.record(stats(0, 2, 0.5), None)
    assert meter.load() == EngineLoad(waiting=0, running=2, kv_cache_usage=0.5)


def test_engine_cores_are_summed_and_their_kv_cache_use_averaged() -> None:
    meter = LoadMeter(cores=2)
    meter.record(0, 2, 10, 0.2, 0)
    meter.record(1, 1, 4, 0.6, 0)
    load = meter.load()
    assert (load.waiting, load.running) == (3, 14)
    assert load.kv_cache_usage == pytest.approx(0.4)


def test_the_step_time_is_learnt_from_decode_steps_that_follow_busy_ones() -> None:
    clock = Clock()
    meter = LoadMeter(learning=0.5, clock=clock)
    meter.record(0, 0, 1, 0.1, prompt_tokens=128)  # a prefill step: not a decode
    clock.now += 0.1
    meter.record(0, 0, 1, 0.1, prompt_tokens=0)  # 0.1 s after a step with one running
    assert meter.step_seconds == pytest.approx(0.1)
    clock.now += 0.3
    meter.record(0, 0, 2, 0.1, prompt_tokens=64)  # a prefill step's length is not counted
    clock.now += 0.2
    meter.record(0, 0, 0, 0.0, prompt_tokens=0)  # the last request finished in this step
    assert meter.step_seconds == pytest.approx(0.15)
    clock.now += 30.0  # idle: the next step is not 30 s long
    meter.record(0, 0, 1, 0.1, prompt_tokens=0)
    assert meter.step_seconds == pytest.approx(0.15)


def test_the_real_iteration_stats_tell_prefill_steps_from_decode_steps() -> None:
    clock = Clock()
    meter = LoadMeter(clock=clock)
    logger = meter.logger(None, 0)  # type: ignore[arg-type]
    logger.record(stats(0, 1, 0.1), iteration(0))
    clock.now += 0.5
    logger.record(stats(0, 1, 0.1), iteration(128))
    assert meter.step_seconds == 0.0
    clock.now += 0.05
    logger.record(stats(0, 1, 0.1), iteration(0))
    assert meter.step_seconds == pytest.approx(0.05)


class IdleLLM:
    errored = False


def adapter(meter: LoadMeter | None) -> VLLMEngine:
    return VLLMEngine(IdleLLM(), tokenizer=None, max_model_len=64, meter=meter)  # type: ignore[arg-type]


def handed_over(meter: LoadMeter, requests: int) -> None:
    for _ in range(requests):
        meter.started()


def test_an_idle_engine_reports_nothing_waiting_or_running_whatever_its_last_step_said() -> None:
    meter = LoadMeter()
    meter.record(0, 7, 9, 0.9, 0)  # the last step, before every request finished
    meter.board.values[0] = 0.08  # the step time learnt
    engine = adapter(meter)
    assert engine.load() == EngineLoad(0, 0, 0.0, 0.08)
    handed_over(meter, 16)
    assert engine.load() == EngineLoad(7, 9, 0.9, 0.08)
    for _ in range(16):
        meter.finished()
    assert engine.load() == EngineLoad(0, 0, 0.0, 0.08)


def test_requests_handed_over_since_the_last_step_count_as_waiting() -> None:
    meter = LoadMeter()
    meter.record(0, 0, 4, 0.3, 0)
    engine = adapter(meter)
    handed_over(meter, 20)  # a burst of 16 reached the engine within its step
    load = engine.load()
    assert load is not None and (load.waiting, load.running) == (16, 4)


def test_workers_sharing_a_board_see_one_engine() -> None:
    """vLLM hands each step's statistics to one of the workers: the meters of two workers over
    one board each see the other's records, and the requests both handed over."""
    board = Board.shared(LoadMeter.board_size())
    clock = Clock()
    first, second = LoadMeter(clock=clock, board=board), LoadMeter(clock=clock, board=board)
    first.record(0, 3, 5, 0.4, prompt_tokens=0)
    clock.now += 0.1
    second.record(0, 2, 6, 0.5, prompt_tokens=0)  # the next step, in the other worker
    handed_over(first, 5)
    handed_over(second, 4)
    for meter in (first, second):
        assert (meter.load().waiting, meter.load().running) == (2, 6)
        assert meter.step_seconds == pytest.approx(0.1)
        assert meter.unfinished == 9
        load = adapter(meter).load()
        assert load is not None and (load.waiting, load.running) == (3, 6)


def test_an_adapter_without_a_meter_knows_no_load() -> None:
    assert adapter(None).load() is None

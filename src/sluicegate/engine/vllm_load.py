"""The in-process engine's load, read from vLLM's own scheduler stats.

After every engine step, vLLM's output handler passes the step's `SchedulerStats` (waiting
and running requests, KV cache use) and `IterationStats` to its stat loggers, on the event
loop. `LoadMeter` is one such logger (beside vLLM's Prometheus one): it keeps the latest
state of each engine core, and learns how long a step takes from the time between steps
while the engine has work. Admission reads it (`inference.load_limits`, the TTFT estimate).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from sluicegate.engine.protocol import EngineLoad


class LoadMeter:
    """The latest scheduler state of each engine core, and the mean step time."""

    def __init__(self, learning: float = 0.2, clock: Callable[[], float] = time.monotonic):
        self._learning = learning
        self._clock = clock
        self._states: dict[int, tuple[int, int, float]] = {}
        """Per engine core: waiting, running, KV cache use after its latest step."""
        self._stepped_at: dict[int, float] = {}
        """Per engine core that still had requests running after its latest step: when."""
        self.step_seconds = 0.0
        """Mean (exponentially weighted) time of a step with no prompt tokens in it."""

    def record(
        self, engine: int, waiting: int, running: int, kv_cache_usage: float, prompt_tokens: int
    ) -> None:
        now = self._clock()
        previous = self._stepped_at.pop(engine, None)
        # A step that follows one with requests still running started when that one ended:
        # the time between them is its length. Prefill steps are not counted: the prompt
        # tokens a request waits behind are already in the TTFT estimate.
        if previous is not None and prompt_tokens == 0:
            length = now - previous
            if self.step_seconds == 0.0:
                self.step_seconds = length
            else:
                self.step_seconds += self._learning * (length - self.step_seconds)
        if running:
            self._stepped_at[engine] = now
        self._states[engine] = (waiting, running, kv_cache_usage)

    def load(self) -> EngineLoad:
        """Waiting and running summed over the engine cores, their mean KV cache use."""
        states = self._states.values()
        if not states:
            return EngineLoad(0, 0, 0.0, self.step_seconds)
        return EngineLoad(
            waiting=sum(state[0] for state in states),
            running=sum(state[1] for state in states),
            kv_cache_usage=sum(state[2] for state in states) / len(states),
            step_seconds=self.step_seconds,
        )

    def logger(self, vllm_config: VllmConfig, engine_index: int = 0) -> StatLoggerBase:
        """vLLM's per-engine stat logger factory (`AsyncLLM(stat_loggers=[meter.logger])`)."""
        return _MeterLogger(self)


class _MeterLogger(StatLoggerBase):
    def __init__(self, meter: LoadMeter) -> None:  # vLLM calls the factory, not this
        self._meter = meter

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: IterationStats | None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is None:
            return
        self._meter.record(
            engine_idx,
            scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
            scheduler_stats.num_running_reqs,
            scheduler_stats.kv_cache_usage,
            0 if iteration_stats is None else iteration_stats.num_prompt_tokens,
        )

    def log_engine_initialized(self) -> None:
        pass

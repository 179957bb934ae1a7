"""The in-process engine's load, read from vLLM's own scheduler stats.

After every engine step, vLLM's output handler passes the step's `SchedulerStats` (waiting
and running requests, KV cache use) and `IterationStats` to its stat loggers, on the event
loop. `LoadMeter` is one such logger (beside vLLM's Prometheus one): it keeps the latest
state of each engine core, and learns how long a step takes from the time between steps
while the engine has work. Admission reads it (`inference.load_limits`, the TTFT estimate).
With several workers, vLLM hands each step's statistics to one of them: the state is kept on
a board in shared memory (`counters.Board`), written by whichever worker has them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vllm.config import VllmConfig
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import IterationStats, SchedulerStats

from sluicegate.counters import Board
from sluicegate.engine.protocol import EngineLoad

_FIELDS = 4
"""Per engine core on the board: waiting, running, KV cache use, when it last stepped with
requests running (-1: it did not)."""
_STEP, _UNFINISHED = 0, 1
"""The board's first two values: the mean step time, and requests handed to the engine
and not finished."""


class LoadMeter:
    """The latest scheduler state of each engine core, the mean step time, and the requests
    in the engine, kept on a `Board`: with several workers (`SLUICEGATE_WORKERS`) vLLM sends
    each step's statistics to one of them, and all of them read the board they share."""

    def __init__(
        self,
        learning: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        board: Board | None = None,
        cores: int = 1,
    ):
        self._learning = learning
        self._clock = clock
        self._cores = cores
        self.board = board or Board.local(self.board_size(cores))
        values = self.board.values
        for core in range(cores):
            values[self._at(core) + 3] = -1.0

    @staticmethod
    def board_size(cores: int = 1) -> int:
        return 2 + _FIELDS * cores

    @staticmethod
    def _at(core: int) -> int:
        return 2 + _FIELDS * core

    @property
    def step_seconds(self) -> float:
        """Mean (exponentially weighted) time of a step with no prompt tokens in it."""
        return self.board.values[_STEP]

    def record(
        self, engine: int, waiting: int, running: int, kv_cache_usage: float, prompt_tokens: int
    ) -> None:
        if engine >= self._cores:
            return
        values, at = self.board.values, self._at(engine)
        now = self._clock()
        previous = values[at + 3]
        # A step that follows one with requests still running started when that one ended:
        # the time between them is its length. Prefill steps are not counted: the prompt
        # tokens a request waits behind are already in the TTFT estimate.
        if previous >= 0 and prompt_tokens == 0:
            length = now - previous
            step = values[_STEP]
            values[_STEP] = length if step == 0.0 else step + self._learning * (length - step)
        values[at + 3] = now if running else -1.0
        values[at], values[at + 1], values[at + 2] = waiting, running, kv_cache_usage

    def load(self) -> EngineLoad:
        """Waiting and running summed over the engine cores, their mean KV cache use."""
        values = self.board.values
        states = [values[self._at(core) : self._at(core) + 3] for core in range(self._cores)]
        return EngineLoad(
            waiting=int(sum(state[0] for state in states)),
            running=int(sum(state[1] for state in states)),
            kv_cache_usage=sum(state[2] for state in states) / len(states),
            step_seconds=values[_STEP],
        )

    def started(self) -> None:
        """A request was handed to the engine."""
        self.board.add(_UNFINISHED, 1)

    def finished(self) -> None:
        """A request handed to the engine finished (or was aborted)."""
        self.board.add(_UNFINISHED, -1)

    @property
    def unfinished(self) -> int:
        """Requests handed to the engine (by any worker) and not finished."""
        return int(self.board.values[_UNFINISHED])

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

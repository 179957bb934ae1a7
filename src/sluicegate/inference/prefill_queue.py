"""Admission by expected time to first token: the runs waiting for their first token, and
how fast the engine works through them.

Each run handed to the engine joins the queue with its prompt tokens, and leaves it at its
first token (or when it ends without one). The engine's drain rate is measured from those
departures: prompt tokens that reached their first token per second of time with runs
waiting, over the last `window` seconds of such time. A new run's expected time to first
token is then the time it has already spent (since its arrival: template, tokenizing, the
cache), plus the step the engine is in when the run reaches it (a busy engine reads new
requests between steps; the engine's measured step time, `EngineLoad.step_seconds`), plus
the prompt tokens ahead of it, its own included, over that rate, plus what these do not
explain (the first token's way back, how a wave of prompts splits over steps). That last
part is learnt from the departures: how much later than predicted each run's first token
came, weighted so that it rises four times faster than it falls. It then follows the late
tail of that error (the 0.8 expectile), not its mean: with the mean, the estimate is short
about as often as it is long, and the admitted runs it was short for miss the objective.

With a TTFT `objective`, a run whose expected wait is past it is refused at once (503
`overloaded`), with a `Retry-After` of how long the queue takes to drain to where a new run
would meet it; so the runs admitted keep their objective instead of every run getting slow.
Until `min_samples` departures have been measured nothing is refused: a cold engine has no
rate to go by. The estimate covers this gateway's own runs, which are all of the engine's
work in-process; an engine shared with others (an upstream) may be busier than it shows.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.errors import OverloadedError
from sluicegate.observability import metrics

MAX_RETRY_AFTER_S = 60


def retry_after(seconds: float | None) -> int:
    """Whole seconds for a `Retry-After`, 1 to `MAX_RETRY_AFTER_S` (1 when not known)."""
    return 1 if seconds is None else min(MAX_RETRY_AFTER_S, max(1, math.ceil(seconds)))


@dataclass(frozen=True, slots=True)
class QueueConfig:
    objective: float | None = None
    """Seconds; None: every run is admitted (the queue is still measured)."""
    window: float = 30.0
    min_samples: int = 8
    learning: float = 0.2
    """Weight of a departure later than the lateness learnt so far."""
    easing: float = 0.05
    """Weight of a departure that came sooner than that."""


class QueueTicket:
    """A run's place in the queue, until its first token (`started`) or its end (`close`)."""

    __slots__ = ("_open", "_queue", "entered", "predicted", "tokens")

    def __init__(
        self, queue: PrefillQueue, tokens: int, entered: float, predicted: float | None
    ) -> None:
        self._queue = queue
        self.tokens = tokens
        self.entered = entered
        self.predicted = predicted
        """Seconds from entering to the first token that the queue and rate foretold."""
        self._open = True

    def started(self) -> None:
        """The run's first token: its prompt is drained."""
        if self._open:
            self._open = False
            self._queue._leave(self, drained=True)

    def close(self) -> None:
        """The run ended; if it never had a first token it drained nothing."""
        if self._open:
            self._open = False
            self._queue._leave(self, drained=False)


class PrefillQueue:
    def __init__(self, config: QueueConfig, clock: Callable[[], float] = time.monotonic):
        self._config = config
        self._clock = clock
        self.waiting = 0
        self.tokens = 0
        """Prompt tokens of the runs waiting for their first token."""
        self._busy_since: float | None = None
        self._samples: deque[tuple[float, int]] = deque()
        """(seconds with runs waiting, tokens drained) since the last departure, per departure."""
        self._busy = 0.0
        self._drained = 0
        self.lateness = 0.0
        """Seconds by which first tokens come later than the step in progress and the queue
        over the rate foretell (their late tail)."""

    def rate(self) -> float | None:
        """Prompt tokens that reach their first token per second while runs wait, or None
        before there are enough departures to tell."""
        # No tokens drained yet (runs with unknown prompt sizes, or none that reached a first
        # token): no rate to go by.
        if len(self._samples) < self._config.min_samples or self._busy <= 0 or self._drained <= 0:
            return None
        return self._drained / self._busy

    def expected_wait(self, tokens: int, in_step: float = 0.0) -> float | None:
        """Seconds until a new run of `tokens` prompt tokens would have its first token,
        handed to an engine `in_step` seconds from the end of the step it is in."""
        drained = self._drained_in(tokens)
        return None if drained is None else in_step + drained + self.lateness

    def drain_seconds(self) -> float | None:
        """Seconds until the runs waiting now have their first tokens (None: not known)."""
        return self._drained_in(0)

    def _drained_in(self, tokens: int) -> float | None:
        rate = self.rate()
        return None if rate is None else (self.tokens + tokens) / rate

    def enter(self, tokens: int, elapsed: float = 0.0, in_step: float = 0.0) -> QueueTicket:
        """Join the queue, or raise `OverloadedError` when the run, `elapsed` seconds after
        its arrival and `in_step` seconds from the end of the engine's current step, would
        miss the objective."""
        objective = self._config.objective
        wait = self.expected_wait(tokens, in_step)
        if objective is not None and wait is not None:
            expected = elapsed + wait
            if expected > objective:
                metrics.ADMISSION_REFUSED.labels("ttft_objective").inc()
                retry = retry_after(expected - objective)
                raise OverloadedError(
                    f"The server cannot start this request within its {objective:g} s "
                    f"objective for the first token (expected {expected:.1f} s). Retry "
                    f"in {retry} s.",
                    headers={"retry-after": str(retry)},
                )
        now = self._clock()
        drained = self._drained_in(tokens)
        predicted = None if drained is None else in_step + drained
        if self.waiting == 0:
            self._busy_since = now
        self.waiting += 1
        self.tokens += tokens
        metrics.PREFILL_QUEUE_TOKENS.set(self.tokens)
        return QueueTicket(self, tokens, now, predicted)

    def _leave(self, ticket: QueueTicket, drained: bool) -> None:
        now = self._clock()
        self.waiting -= 1
        self.tokens -= ticket.tokens
        metrics.PREFILL_QUEUE_TOKENS.set(self.tokens)
        busy = 0.0
        if self._busy_since is not None:
            busy = now - self._busy_since
            self._busy_since = now if self.waiting else None
        if drained:
            if ticket.predicted is not None:
                late = max(0.0, now - ticket.entered - ticket.predicted)
                config = self._config
                weight = config.learning if late > self.lateness else config.easing
                self.lateness += weight * (late - self.lateness)
            self._add(busy, ticket.tokens)
        elif busy:
            self._add(busy, 0)

    def _add(self, busy: float, tokens: int) -> None:
        samples = self._samples
        samples.append((busy, tokens))
        self._busy += busy
        self._drained += tokens
        # Keep the last `window` seconds of busy time (and at least min_samples departures).
        while len(samples) > self._config.min_samples and self._busy - samples[0][0] >= (
            self._config.window
        ):
            old_busy, old_tokens = samples.popleft()
            self._busy -= old_busy
            self._drained -= old_tokens
        metrics.PREFILL_RATE.set(self.rate() or 0.0)

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
rate to go by.

The estimate cannot latch shut. It learns only from runs it admitted, so a refusal teaches it
nothing; one first token far later than foretold could otherwise push it past the objective
for good (86,400 refusals in a simulated day). Three things undo that: the learnt lateness
halves every `lateness_half_life` seconds that pass, and is never more than `lateness_cap` of
the objective; with nothing waiting, a run is admitted whatever the estimate says at least
every `trickle` seconds, so there are always fresh departures to learn from; and runs whose
first token waits on something the forecast does not model (a grammar compiled for
structured outputs, 1.5 to 2 s on a new schema) teach it nothing (`learns=False`).

The estimate covers this gateway's own runs, which are all of the engine's
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
    lateness_half_life: float = 30.0
    """Seconds in which the learnt lateness halves, whatever departs."""
    lateness_cap: float = 0.5
    """The learnt lateness is at most this fraction of the objective."""
    trickle: float = 1.0
    """With nothing waiting, a run is admitted at least this often (seconds), even when the
    estimate is past the objective."""


class QueueTicket:
    """A run's place in the queue, until its first token (`started`) or its end (`close`)."""

    __slots__ = ("_open", "_queue", "entered", "learns", "predicted", "tokens")

    def __init__(
        self,
        queue: PrefillQueue,
        tokens: int,
        entered: float,
        predicted: float | None,
        learns: bool = True,
    ) -> None:
        self._queue = queue
        self.tokens = tokens
        self.entered = entered
        self.predicted = predicted
        """Seconds from entering to the first token that the queue and rate foretold."""
        self.learns = learns
        """Whether its first token teaches the rate and lateness (see the module docstring)."""
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
        self._lateness = 0.0
        self._lateness_at = clock()
        self._last_admitted: float | None = None

    @property
    def lateness(self) -> float:
        """Seconds by which first tokens come later than the step in progress and the queue
        over the rate foretell (their late tail), aged and capped."""
        config = self._config
        age = max(0.0, self._clock() - self._lateness_at)
        lateness = self._lateness * math.pow(0.5, age / config.lateness_half_life)
        if config.objective is not None:
            lateness = min(lateness, config.lateness_cap * config.objective)
        return lateness

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

    def enter(
        self, tokens: int, elapsed: float = 0.0, in_step: float = 0.0, learns: bool = True
    ) -> QueueTicket:
        """Join the queue, or raise `OverloadedError` when the run, `elapsed` seconds after
        its arrival and `in_step` seconds from the end of the engine's current step, would
        miss the objective (unless it is the idle queue's trickle)."""
        objective = self._config.objective
        wait = self.expected_wait(tokens, in_step)
        if objective is not None and wait is not None and not self._trickles():
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
        self._last_admitted = now
        metrics.PREFILL_QUEUE_TOKENS.set(self.tokens)
        return QueueTicket(self, tokens, now, predicted, learns)

    def _trickles(self) -> bool:
        """Whether nothing waits and no run was admitted for `trickle` seconds: then one is,
        whatever the estimate, so the estimate meets the engine as it is now."""
        last = self._last_admitted
        return self.waiting == 0 and (last is None or self._clock() - last >= self._config.trickle)

    def _leave(self, ticket: QueueTicket, drained: bool) -> None:
        now = self._clock()
        self.waiting -= 1
        self.tokens -= ticket.tokens
        metrics.PREFILL_QUEUE_TOKENS.set(self.tokens)
        busy = 0.0
        if self._busy_since is not None:
            busy = now - self._busy_since
            self._busy_since = now if self.waiting else None
        if not ticket.learns:
            return
        if drained:
            if ticket.predicted is not None:
                late = max(0.0, now - ticket.entered - ticket.predicted)
                config = self._config
                lateness = self.lateness
                weight = config.learning if late > lateness else config.easing
                self._lateness = lateness + weight * (late - lateness)
                self._lateness_at = now
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

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
rate to go by. The objective may change while runs wait (`set_objective`, at run time:
`inference.admission`): the runs that enter after are judged by it, on what was measured. What
was measured can be forgotten (`forget`, `POST /admin/admission/reset`): the queue is then as
on a new engine.

The estimate cannot latch shut. It learns only from runs it admitted, so a refusal teaches it
nothing; one first token far later than foretold could otherwise push it past the objective
for good (86,400 refusals in a simulated day). Four things undo that: the learnt lateness
halves every `lateness_half_life` seconds that pass, and is never more than `lateness_cap` of
the objective; departures older than `rate_age` no longer count towards the rate (with too
few left, the estimate is cold again and admits all); with nothing waiting, a run is
admitted whatever the estimate says at least every `trickle` seconds, so there are always
fresh departures to learn from; and runs whose
first token waits on something the forecast does not model (a grammar compiled for
structured outputs, 1.5 to 2 s on a new schema) teach it nothing (`learns=False`).

A run waits only behind the runs the engine takes before it: with priority scheduling
(vLLM runs lower values first, ties by arrival) those of its own engine priority and lower
(`Backlog`), so a higher-ranked key is not refused for a lower one's queue it jumps; first
come, first served, that is every run waiting. And the key that holds the backlog is
refused before the others: a key whose runs are at least its even part of the backlog ahead
(its tokens × the keys waiting >= the tokens ahead) is refused past the objective; another
key's run only past `NOT_HOLDER_SLACK` times it. So one key's flood stops at the objective,
and the room above it is the other keys'; their first tokens may then come up to that much
later than the objective, which is better than not at all.

The estimate covers this gateway's own runs, which are all of the engine's
work in-process; an engine shared with others (an upstream) may be busier than it shows.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sluicegate.errors import OverloadedError
from sluicegate.observability import metrics

MAX_RETRY_AFTER_S = 60
NOT_HOLDER_SLACK = 1.5
"""A key that does not hold the backlog is refused only past this times a bound."""


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
    rate_age: float = 300.0
    """Seconds of wall time after which a departure no longer counts towards the rate: an
    engine measured slow (or fast) long ago is measured anew."""


@dataclass(frozen=True, slots=True)
class Backlog:
    """What waits for its first token ahead of a new run (of its engine priority or lower),
    and how much of it is the run's own key's."""

    tokens: int = 0
    runs: int = 0
    own_tokens: int = 0
    own_runs: int = 0
    keys: int = 1
    """Keys with runs ahead, the new run's own counted."""
    all_runs: int = 0
    """Runs waiting, whatever their priority."""

    @property
    def holds_tokens(self) -> bool:
        """Whether the key holds at least its even part of the tokens ahead."""
        return self.own_tokens * self.keys >= self.tokens

    @property
    def holds_runs(self) -> bool:
        """Whether the key holds at least its even part of the runs ahead."""
        return self.own_runs * self.keys >= self.runs


def slack(bound: float, holds: bool) -> float:
    """The bound a run is refused past: `bound` for the key holding the backlog, more for
    the others (`NOT_HOLDER_SLACK`)."""
    return bound if holds else bound * NOT_HOLDER_SLACK


class QueueTicket:
    """A run's place in the queue, until its first token (`started`) or its end (`close`)."""

    __slots__ = ("_open", "_queue", "entered", "key", "learns", "predicted", "priority", "tokens")

    def __init__(
        self,
        queue: PrefillQueue,
        tokens: int,
        entered: float,
        predicted: float | None,
        learns: bool = True,
        priority: int = 0,
        key: str = "",
    ) -> None:
        self._queue = queue
        self.priority = priority
        self.key = key
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
        self.tokens = 0
        """Prompt tokens of the runs waiting for their first token."""
        self._tickets: set[QueueTicket] = set()
        self._busy_since: float | None = None
        self._samples: deque[tuple[float, float, int]] = deque()
        """(when, seconds with runs waiting, tokens drained) since the last departure, per
        departure."""
        self._busy = 0.0
        self._drained = 0
        self._lateness = 0.0
        self._lateness_at = clock()
        self._last_admitted: float | None = None

    @property
    def waiting(self) -> int:
        """Runs waiting for their first token."""
        return len(self._tickets)

    @property
    def objective(self) -> float | None:
        return self._config.objective

    def set_objective(self, objective: float | None) -> None:
        """The objective of the runs that enter from now on (None: every run is admitted).
        What was measured stays: the rate and the lateness are the engine's, not the
        objective's; the runs waiting keep their places."""
        self._config = dataclasses.replace(self._config, objective=objective)

    def forget(self) -> None:
        """Forget what was measured (the drain rate, the lateness, the last admission): from
        here the queue is as on a new engine, admitting every run until `min_samples`
        departures are measured again. The runs waiting keep their places; their first tokens
        are the first departures measured, and teach no lateness (what they were foretold
        came from what is forgotten)."""
        now = self._clock()
        for ticket in self._tickets:
            ticket.predicted = None
        self._samples.clear()
        self._busy = 0.0
        self._drained = 0
        self._lateness = 0.0
        self._lateness_at = now
        self._last_admitted = None
        if self._busy_since is not None:
            self._busy_since = now
        metrics.PREFILL_RATE.set(0.0)

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
        self._forget_old()
        # No tokens drained yet (runs with unknown prompt sizes, or none that reached a first
        # token): no rate to go by.
        if len(self._samples) < self._config.min_samples or self._busy <= 0 or self._drained <= 0:
            return None
        return self._drained / self._busy

    def backlog(self, priority: int = 0, key: str = "") -> Backlog:
        """What a new run of engine `priority` for `key` would wait behind."""
        tokens = runs = own_tokens = own_runs = 0
        keys = {key}
        for ticket in self._tickets:
            if ticket.priority <= priority:
                tokens += ticket.tokens
                runs += 1
                keys.add(ticket.key)
                if ticket.key == key:
                    own_tokens += ticket.tokens
                    own_runs += 1
        return Backlog(tokens, runs, own_tokens, own_runs, len(keys), len(self._tickets))

    def expected_wait(
        self, tokens: int, in_step: float = 0.0, ahead: int | None = None
    ) -> float | None:
        """Seconds until a new run of `tokens` prompt tokens would have its first token,
        handed to an engine `in_step` seconds from the end of the step it is in, behind
        `ahead` tokens (all that wait when None)."""
        drained = self._drained_in(tokens, ahead)
        return None if drained is None else in_step + drained + self.lateness

    def drain_seconds(self) -> float | None:
        """Seconds until the runs waiting now have their first tokens (None: not known)."""
        return self._drained_in(0)

    def _drained_in(self, tokens: int, ahead: int | None = None) -> float | None:
        rate = self.rate()
        ahead = self.tokens if ahead is None else ahead
        return None if rate is None else (ahead + tokens) / rate

    def enter(
        self,
        tokens: int,
        elapsed: float = 0.0,
        in_step: float = 0.0,
        learns: bool = True,
        priority: int = 0,
        key: str = "",
    ) -> QueueTicket:
        """Join the queue, or raise `OverloadedError` when the run, `elapsed` seconds after
        its arrival and `in_step` seconds from the end of the engine's current step, would
        miss the objective (past its slack when its key does not hold the backlog; unless
        it is the idle queue's trickle)."""
        objective = self._config.objective
        backlog = self.backlog(priority, key)
        wait = self.expected_wait(tokens, in_step, backlog.tokens)
        if objective is not None and wait is not None and not self._trickles():
            expected = elapsed + wait
            if expected > slack(objective, backlog.holds_tokens):
                metrics.ADMISSION_REFUSED.labels("ttft_objective").inc()
                retry = retry_after(expected - objective)
                raise OverloadedError(
                    f"The server cannot start this request within its {objective:g} s "
                    f"objective for the first token (expected {expected:.1f} s). Retry "
                    f"in {retry} s.",
                    headers={"retry-after": str(retry)},
                )
        now = self._clock()
        drained = self._drained_in(tokens, backlog.tokens)
        predicted = None if drained is None else in_step + drained
        if self.waiting == 0:
            self._busy_since = now
        self.tokens += tokens
        self._last_admitted = now
        metrics.PREFILL_QUEUE_TOKENS.set(self.tokens)
        ticket = QueueTicket(self, tokens, now, predicted, learns, priority, key)
        self._tickets.add(ticket)
        return ticket

    def _trickles(self) -> bool:
        """Whether nothing waits and no run was admitted for `trickle` seconds: then one is,
        whatever the estimate, so the estimate meets the engine as it is now."""
        last = self._last_admitted
        return self.waiting == 0 and (last is None or self._clock() - last >= self._config.trickle)

    def _leave(self, ticket: QueueTicket, drained: bool) -> None:
        now = self._clock()
        self._tickets.discard(ticket)
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
        samples.append((self._clock(), busy, tokens))
        self._busy += busy
        self._drained += tokens
        # Keep the last `window` seconds of busy time (and at least min_samples departures).
        while len(samples) > self._config.min_samples and self._busy - samples[0][1] >= (
            self._config.window
        ):
            self._drop_oldest()
        metrics.PREFILL_RATE.set(self.rate() or 0.0)

    def _forget_old(self) -> None:
        """Drop the departures older than `rate_age` of wall time, however few are left."""
        samples = self._samples
        oldest = self._clock() - self._config.rate_age
        while samples and samples[0][0] < oldest:
            self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, busy, tokens = self._samples.popleft()
        self._busy -= busy
        self._drained -= tokens

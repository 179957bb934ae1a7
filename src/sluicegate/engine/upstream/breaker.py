"""A circuit breaker per upstream: closed, open, half-open.

Closed: requests flow; the breaker opens after `failures` consecutive failures, or when the
last `window` outcomes hold at least `error_ratio` failures. Open: no request is sent until
`open_seconds` have passed. Half-open: one trial request at a time; its success closes the
breaker, its failure opens it again.

Each request holds the `Ticket` it was let through with, and reports its outcome with it. An
outcome counts only in the period (closed, or open with its trial) its ticket was taken in:
requests sent before the breaker opened, failing while it is open, neither extend the open
time nor take the trial's place, and a stale success does not close it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from sluicegate.engine.upstream.config import BreakerConfig

BreakerState = Literal["closed", "open", "half_open"]
STATE_VALUES: dict[BreakerState, int] = {"closed": 0, "open": 1, "half_open": 2}


@dataclass(frozen=True, slots=True)
class Ticket:
    """The right to send one request, taken in one period of the breaker."""

    period: int
    trial: bool = False


class Breaker:
    def __init__(
        self,
        config: BreakerConfig,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[BreakerState], None] | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self.on_change = on_change
        """Told the state each time it is found changed (the breaker-state gauge): a gauge
        read at scrape time would not work across worker processes."""
        self._shown: BreakerState = "closed"
        self._outcomes: deque[bool] = deque(maxlen=config.window)
        self._failures = 0
        self._consecutive = 0
        self._opened_at = 0.0
        self._open = False
        self._trial = False
        self._period = 0
        """Counts the breaker's changes between closed and open."""

    @property
    def state(self) -> BreakerState:
        if not self._open:
            state: BreakerState = "closed"
        elif self._clock() - self._opened_at >= self._config.open_seconds:
            state = "half_open"
        else:
            state = "open"
        if state != self._shown:
            self._shown = state
            if self.on_change is not None:
                self.on_change(state)
        return state

    def value(self) -> float:
        """The state as a number (the breaker-state gauge)."""
        return STATE_VALUES[self.state]

    def available(self) -> bool:
        """Whether a request may be sent now (without taking the half-open trial)."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._trial)

    def wait(self) -> float:
        """Seconds until it lets a request through: while open, what is left of
        `open_seconds`; else 0 (a half-open trial already out may end any moment)."""
        if not self._open:
            return 0.0
        return max(0.0, self._config.open_seconds - (self._clock() - self._opened_at))

    def acquire(self) -> Ticket | None:
        """The right to send one request (in half-open, the one trial), or None."""
        state = self.state
        if state == "closed":
            return Ticket(self._period)
        if state == "half_open" and not self._trial:
            self._trial = True
            return Ticket(self._period, trial=True)
        return None

    def success(self, ticket: Ticket) -> None:
        if not self._current(ticket):
            return
        if self._open:
            self._close()
        self._record(False)
        self._consecutive = 0

    def failure(self, ticket: Ticket) -> None:
        if not self._current(ticket):
            return
        if self._open:
            self._trip()  # the trial failed
            return
        self._record(True)
        self._consecutive += 1
        config = self._config
        full = len(self._outcomes) == config.window
        if self._consecutive >= config.failures or (
            full and self._failures >= config.error_ratio * config.window
        ):
            self._trip()

    def release(self, ticket: Ticket) -> None:
        """A request that ended neither way (the client left, or the upstream was busy): if
        it was the trial, free it."""
        if ticket.trial and self._current(ticket):
            self._trial = False

    def _current(self, ticket: Ticket) -> bool:
        """Whether the ticket was taken in this period; while open, only the trial's is."""
        return ticket.period == self._period and (ticket.trial or not self._open)

    def _record(self, failed: bool) -> None:
        if len(self._outcomes) == self._config.window and self._outcomes[0]:
            self._failures -= 1
        self._outcomes.append(failed)
        self._failures += failed

    def _trip(self) -> None:
        self._open = True
        self._trial = False
        self._period += 1
        self._opened_at = self._clock()
        _ = self.state  # shown at once

    def _close(self) -> None:
        self._open = False
        self._trial = False
        self._period += 1
        self._outcomes.clear()
        self._failures = 0
        _ = self.state  # shown at once

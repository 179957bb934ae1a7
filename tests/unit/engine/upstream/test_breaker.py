"""The upstream circuit breaker on its own."""

from __future__ import annotations

from sluicegate.engine.upstream.breaker import Breaker
from sluicegate.engine.upstream.config import BreakerConfig
from tests.support.clock import Clock


def _fail(breaker: Breaker, times: int = 1) -> None:
    for _ in range(times):
        ticket = breaker.acquire()
        assert ticket is not None
        breaker.failure(ticket)


def _succeed(breaker: Breaker) -> None:
    ticket = breaker.acquire()
    assert ticket is not None
    breaker.success(ticket)


def test_consecutive_failures_open_the_breaker_and_a_trial_closes_it() -> None:
    clock = Clock()
    breaker = Breaker(BreakerConfig(failures=3, window=100, open_seconds=5), clock)
    _fail(breaker, 2)
    assert breaker.state == "closed"
    _fail(breaker)
    assert breaker.state == "open" and breaker.acquire() is None
    clock.now += 5
    assert breaker.state == "half_open"
    trial = breaker.acquire()  # the one trial
    assert trial is not None and trial.trial
    assert breaker.acquire() is None and not breaker.available()
    breaker.success(trial)
    assert breaker.state == "closed" and breaker.acquire() is not None


def test_a_failed_trial_opens_the_breaker_again() -> None:
    clock = Clock()
    breaker = Breaker(BreakerConfig(failures=1, open_seconds=2), clock)
    _fail(breaker)
    clock.now += 2
    _fail(breaker)  # the trial
    assert breaker.state == "open"
    clock.now += 1.9
    assert breaker.state == "open"


def test_failures_of_requests_sent_before_it_opened_do_not_extend_the_open_time() -> None:
    clock = Clock()
    breaker = Breaker(BreakerConfig(failures=2, open_seconds=5), clock)
    in_flight = [breaker.acquire() for _ in range(4)]
    for ticket in in_flight[:2]:
        assert ticket is not None
        breaker.failure(ticket)
    assert breaker.state == "open"
    clock.now += 4
    assert in_flight[2] is not None
    breaker.failure(in_flight[2])  # still open: it would have reopened it for 5 s more
    clock.now += 1
    assert breaker.state == "half_open"
    trial = breaker.acquire()
    assert trial is not None
    # A late failure while the trial is out neither reopens the breaker nor frees the trial.
    assert in_flight[3] is not None
    breaker.failure(in_flight[3])
    breaker.release(in_flight[3])
    assert breaker.state == "half_open" and breaker.acquire() is None
    breaker.success(trial)
    assert breaker.state == "closed"


def test_a_late_success_does_not_close_an_open_breaker() -> None:
    clock = Clock()
    breaker = Breaker(BreakerConfig(failures=1, open_seconds=5), clock)
    early = breaker.acquire()
    _fail(breaker)
    assert early is not None
    breaker.success(early)  # sent before it opened: says nothing of the upstream now
    assert breaker.state == "open"


def test_the_error_ratio_opens_the_breaker_without_a_run_of_failures() -> None:
    breaker = Breaker(BreakerConfig(failures=100, error_ratio=0.5, window=10), Clock())
    for _ in range(5):
        _succeed(breaker)
        _fail(breaker)
    assert breaker.state == "open"
    healthy = Breaker(BreakerConfig(failures=100, error_ratio=0.5, window=10), Clock())
    for i in range(40):
        _fail(healthy) if i % 3 == 0 else _succeed(healthy)
    assert healthy.state == "closed"


def test_every_change_of_state_is_told_once_as_it_is_seen() -> None:
    """The gauge is set from `on_change`: at the trip, at the close, and when time has made an
    open breaker half-open and someone looks."""
    clock = Clock()
    seen: list[str] = []
    breaker = Breaker(BreakerConfig(failures=1, open_seconds=5.0), clock=clock)
    breaker.on_change = seen.append
    ticket = breaker.acquire()
    assert ticket is not None
    breaker.failure(ticket)
    assert seen == ["open"]
    clock.now += 5.0
    assert seen == ["open"]  # nobody looked yet
    trial = breaker.acquire()
    assert trial is not None and seen == ["open", "half_open"]
    breaker.success(trial)
    assert seen == ["open", "half_open", "closed"]

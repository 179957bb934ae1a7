"""The upstream policies on their own: breaker, retry budget, backoff, balancer."""

from __future__ import annotations

import random
from collections import Counter

from prometheus_client import REGISTRY

from sluicegate.engine.upstream.balancer import Balancer
from sluicegate.engine.upstream.breaker import Breaker
from sluicegate.engine.upstream.config import AffinityConfig, BreakerConfig, PoolConfig, RetryConfig
from sluicegate.engine.upstream.retry import RetryBudget, backoff, retry_after
from sluicegate.engine.upstream.server import Upstream


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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


def test_the_retry_budget_allows_a_fifth_of_requests_after_its_burst() -> None:
    budget = RetryBudget(RetryConfig(budget=0.2, burst=2))
    assert budget.withdraw() and budget.withdraw() and not budget.withdraw()
    allowed = 0
    for _ in range(1000):
        budget.deposit()
        allowed += budget.withdraw()
    assert 195 <= allowed <= 200


def test_backoff_is_exponential_with_full_jitter() -> None:
    config = RetryConfig(backoff=0.1, backoff_max=1.0)
    rng = random.Random(7)
    for attempt, ceiling in [(0, 0.1), (1, 0.2), (2, 0.4), (5, 1.0)]:
        waits = [backoff(config, attempt, rng) for _ in range(500)]
        assert all(0 <= w <= ceiling for w in waits)
        assert max(waits) > 0.9 * ceiling and min(waits) < 0.1 * ceiling


def test_retry_after_reads_seconds_and_dates() -> None:
    assert retry_after("3", 60) == 3.0
    assert retry_after(None, 60) is None and retry_after("soon", 60) is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 60) == 0.0  # in the past


def test_retry_after_is_finite_and_at_most_its_bound() -> None:
    for endless in ("inf", "Infinity", "1e9", "1e400", "Fri, 31 Dec 9999 23:59:59 GMT"):
        assert retry_after(endless, 60) == 60.0, endless
    assert retry_after("-inf", 60) == 0.0
    assert retry_after("nan", 60) is None
    assert retry_after("30", 5.5) == 5.5


def _upstreams(*weights: float) -> list[Upstream]:
    return [
        Upstream(f"http://10.0.0.{i}:8000/v1", w, PoolConfig(), BreakerConfig())
        for i, w in enumerate(weights)
    ]


def test_two_choices_prefer_the_less_loaded_and_follow_weights() -> None:
    upstreams = _upstreams(1, 1, 1)
    upstreams[0].in_flight = 10
    balancer = Balancer(upstreams, rng=random.Random(1))
    picks = Counter(balancer.pick() for _ in range(3000))
    # The loaded one wins only when drawn twice, which two distinct draws never are.
    assert picks[0] == 0 and picks[1] > 1200 and picks[2] > 1200
    weighted = Balancer(_upstreams(3, 1), rng=random.Random(2))
    counts = Counter(weighted.pick() for _ in range(4000))
    # Idle upstreams tie on load; the first draw, weighted 3:1, wins ties.
    assert 2800 <= counts[0] <= 3200
    loaded = _upstreams(3, 1)
    loaded[0].in_flight = 2  # 2/3 per unit of weight, more than the idle one's 0
    assert Balancer(loaded, rng=random.Random(5)).pick() == 1


def test_unavailable_and_tried_upstreams_are_skipped() -> None:
    upstreams = _upstreams(1, 1)
    balancer = Balancer(upstreams, rng=random.Random(3))
    upstreams[0].healthy = False
    assert {balancer.pick() for _ in range(50)} == {1}
    assert balancer.pick(tried={1}) == 1  # nothing else is left
    upstreams[1].healthy = False
    assert balancer.pick() is None


def test_affinity_sends_a_prefix_to_one_upstream_until_it_is_overloaded() -> None:
    upstreams = _upstreams(1, 1, 1, 1)
    balancer = Balancer(upstreams, AffinityConfig(chars=64, load_factor=1.25), random.Random(4))
    prefixes = [f"system prompt number {i} " * 4 for i in range(40)]
    homes = {p: balancer.pick(p + "question A") for p in prefixes}
    assert all(balancer.pick(p + "another question") == homes[p] for p in prefixes)
    assert len(set(homes.values())) == 4  # the ring spreads prefixes over every upstream
    prefix = prefixes[0]
    home = homes[prefix]
    assert home is not None
    upstreams[home].in_flight = 8  # far above its share of 8 + 1 in flight
    assert balancer.pick(prefix) != home


def _picks(label: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "sluicegate_upstream_affinity_picks_total", {"upstream": label, "result": result}
    )
    return value or 0.0


def test_affine_picks_are_counted_as_home_or_spilled() -> None:
    upstreams = _upstreams(1, 1)
    balancer = Balancer(upstreams, AffinityConfig(chars=64, load_factor=1.0), random.Random(1))
    prefix = "a shared system prompt " * 4
    home = balancer.pick(prefix)
    assert home is not None
    other = 1 - home
    before = {
        (i, r): _picks(upstreams[i].label, r) for i in (home, other) for r in ("home", "spilled")
    }

    def added(index: int, result: str) -> float:
        return _picks(upstreams[index].label, result) - before[(index, result)]

    assert balancer.pick(prefix) == home
    assert added(home, "home") == 1
    upstreams[home].in_flight = 3  # above its bound: 3 + 1 > 1.0 x (3 + 1) / 2
    assert balancer.pick(prefix) == other
    assert added(other, "spilled") == 1
    # The home is within its bound again: 3 + 1 <= ceil((3 + 3 + 1) / 2).
    upstreams[other].in_flight = 3
    assert balancer.pick(prefix) == home
    assert added(home, "home") == 2
    assert added(home, "spilled") == added(other, "home") == 0

"""The balancer on its own: two choices, weights, skips, prefix affinity."""

from __future__ import annotations

import random
from collections import Counter

from sluicegate.engine.upstream.balancer import Balancer
from sluicegate.engine.upstream.config import AffinityConfig, BreakerConfig, PoolConfig
from sluicegate.engine.upstream.server import Upstream
from tests.support.metrics import local_value


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
    return local_value("sluicegate_upstream_affinity_picks_total", upstream=label, result=result)


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


def test_an_adapter_goes_to_the_upstreams_that_list_it_within_their_load_bound() -> None:
    upstreams = _upstreams(1, 1, 1)
    balancer = Balancer(upstreams, rng=random.Random(4))
    listing = frozenset({2})
    assert {balancer.pick(prefer=listing) for _ in range(200)} == {2}
    # Past its bound (twice its share of what is in flight), the others take it.
    upstreams[2].in_flight = 6
    upstreams[0].in_flight = upstreams[1].in_flight = 1
    assert 2 not in {balancer.pick(prefer=listing) for _ in range(200)}
    # Unavailable, it is passed over too.
    upstreams[2].in_flight = 0
    upstreams[2].healthy = False
    assert 2 not in {balancer.pick(prefer=listing) for _ in range(200)}


def test_a_refusal_says_when_the_first_upstream_may_be_tried_again() -> None:
    """The soonest of: a `Retry-After` wait, an open breaker's, an unhealthy upstream's next
    probe; rounded up, at least 1 s; a failure that says it already keeps its own."""
    from sluicegate.errors import EngineUnavailableError, RateLimitError

    upstreams = _upstreams(1, 1)
    balancer = Balancer(upstreams)
    upstreams[0].hold_off(100, rate_limited=True)
    upstreams[1].healthy = False
    refused = balancer.refusal(None, probe_interval=5)
    assert isinstance(refused, EngineUnavailableError)
    assert refused.headers["retry-after"] == "5"
    upstreams[1].healthy = True
    upstreams[1].hold_off(30.2, rate_limited=True)
    assert balancer.refusal(None, probe_interval=5).headers["retry-after"] in ("31", "30")
    own = RateLimitError("limited", headers={"retry-after": "7"})
    assert balancer.refusal(own, probe_interval=5).headers["retry-after"] == "7"
    upstreams[1].not_before = 0.0
    assert balancer.refusal(None, probe_interval=5).headers["retry-after"] == "1"

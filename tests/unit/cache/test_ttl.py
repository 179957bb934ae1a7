"""The TTL policy: by observed latency, clamped, jittered."""

from __future__ import annotations

import random

import pytest

from sluicegate.cache.ttl import TtlPolicy, TtlRule


def test_ttl_follows_observed_latency_by_the_table() -> None:
    rule = TtlRule(base=100, minimum=1, maximum=1000, jitter=0)
    policy = TtlPolicy(rule)
    assert policy.effective() == 100  # nothing observed yet
    policy.observe(0.05)
    assert policy.effective() == 300
    policy.observe(0.5)  # average now 0.2*0.5 + 0.8*0.05 = 0.14: still fast
    assert policy.latency == pytest.approx(0.14) and policy.effective() == 300
    for _ in range(10):
        policy.observe(0.5)
    assert 0.2 < policy.latency < 0.8 and policy.effective() == 100  # type: ignore[operator]
    for _ in range(20):
        policy.observe(5.0)
    assert policy.effective() == 50


def test_ttl_is_clamped_then_jittered_within_ten_percent() -> None:
    policy = TtlPolicy(TtlRule(base=100, minimum=1, maximum=200), rng=random.Random(1))
    policy.observe(0.01)  # 3 x 100, clamped to 200
    assert policy.effective() == 200
    samples = [policy.sample_ms() for _ in range(2000)]
    assert min(samples) >= 180_000 and max(samples) <= 220_000
    assert max(samples) - min(samples) > 30_000, "jitter spreads expiries"
    assert TtlPolicy(TtlRule(base=1, minimum=30, maximum=60, jitter=0)).effective() == 30

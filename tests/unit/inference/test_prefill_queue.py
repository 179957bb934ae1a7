"""Admission by expected time to first token (`inference.prefill_queue`): the drain rate
measured from first tokens, refusals with a Retry-After from it, and through the app with
the fake engine."""

from __future__ import annotations

import dataclasses
import math

import pytest
from fastapi.testclient import TestClient

from sluicegate.errors import OverloadedError
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig
from tests.support.clock import Clock
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, measured_prefill_queue


def test_the_rate_is_tokens_drained_per_second_with_runs_waiting() -> None:
    queue, clock = measured_prefill_queue(100, objective=None)
    assert queue.rate() == 100.0
    clock.now += 10  # idle time does not count
    a, b = queue.enter(100), queue.enter(300)
    clock.now += 2.0
    a.started()
    b.started()  # both in one engine step: 400 tokens in 2 s
    assert queue.rate() == pytest.approx(500 / 3)
    assert queue.waiting == 0 and queue.tokens == 0


def test_a_run_that_would_miss_the_objective_is_refused_with_the_time_to_drain() -> None:
    queue, clock = measured_prefill_queue(100, objective=3.2)
    waiting = [queue.enter(100) for _ in range(3)]  # 1, 2 and 3 s: admitted
    assert queue.expected_wait(250) == pytest.approx(5.5)
    with pytest.raises(OverloadedError) as refused:
        queue.enter(250)
    assert refused.value.status_code == 503
    assert refused.value.headers == {"retry-after": "3"}  # 5.5 s expected, 3.2 s allowed
    assert "3.2 s objective" in str(refused.value)
    assert queue.waiting == 3  # the refused run took no place
    for ticket in waiting[:2]:  # the engine keeps its pace: 100 tokens a second
        clock.now += 1.0
        ticket.started()
    assert queue.rate() == pytest.approx(100.0)
    with pytest.raises(OverloadedError):
        queue.enter(250)  # 100 + 250 tokens at 100/s: 3.5 s
    clock.now += 1.0
    waiting[2].started()
    assert queue.enter(250).tokens == 250  # 2.5 s: admitted


def test_a_run_that_ends_without_a_first_token_frees_its_place_and_drains_nothing() -> None:
    queue, clock = measured_prefill_queue(100, objective=None)
    ticket = queue.enter(1000)
    clock.now += 1.0
    ticket.close()
    ticket.started()  # late: ignored
    assert queue.tokens == 0 and queue.waiting == 0
    assert queue.rate() == pytest.approx(50.0)  # 100 tokens over 2 busy seconds


def test_nothing_is_refused_before_the_rate_is_known_or_without_an_objective() -> None:
    cold = PrefillQueue(QueueConfig(objective=0.001))
    for _ in range(20):
        cold.enter(10_000)
    assert cold.rate() is None
    unbounded, _ = measured_prefill_queue(1, objective=None)
    unbounded.enter(1_000_000)


def test_the_rate_follows_the_last_window_of_busy_time() -> None:
    clock = Clock(0.0)
    queue = PrefillQueue(QueueConfig(objective=None, window=10.0, min_samples=2), clock)
    for tokens in (100, 100, 100, 1000, 1000, 1000):  # the engine got ten times faster
        ticket = queue.enter(tokens)
        clock.now += 5.0
        ticket.started()
    assert queue.rate() == pytest.approx(200.0)


def test_through_the_app_a_late_first_token_is_a_503_and_a_stream_too() -> None:
    engine = FakeEngine(delays=[0.05, 0.0])
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(fake_app(engine, ttft_objective=0.01)) as client:
        for _ in range(8):  # cold: admitted while the rate is measured
            assert client.post("/v1/chat/completions", json=body).status_code == 200
        refused = client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "overloaded"
        streamed = client.post("/v1/chat/completions", json={**body, "stream": True})
        assert streamed.status_code == 503
    assert len(engine.requests) == 8  # the refused runs never reached the engine


def test_first_tokens_later_than_foretold_are_learnt_and_counted_in() -> None:
    clock = Clock(0.0)
    # No ageing here: the learning rule alone.
    config = QueueConfig(objective=None, min_samples=1, learning=0.5, lateness_half_life=math.inf)
    queue = PrefillQueue(config, clock)
    first = queue.enter(100)
    clock.now += 1.0
    first.started()  # 100 tokens a second
    for _ in range(2):  # each foretold 1 s, each came after 1.5 s (a step in progress)
        ticket = queue.enter(100)
        clock.now += 1.5
        ticket.started()
    # The second was 0.5 s late (foretold 1 s at 100/s); the third 0.25 s (1.25 s at 80/s).
    assert queue.lateness == pytest.approx(0.25)
    assert queue.rate() == pytest.approx(75.0)
    assert queue.expected_wait(100) == pytest.approx(100 / 75 + 0.25)


def test_the_time_a_run_already_spent_counts_against_its_objective() -> None:
    queue, _ = measured_prefill_queue(100, objective=2.0)
    queue.enter(150, elapsed=0.4)  # 0.4 s spent + 1.5 s of queue: 1.9 s, admitted
    with pytest.raises(OverloadedError):
        queue.enter(10, elapsed=0.5)  # 0.5 + 1.6 s
    queue.enter(10, elapsed=0.3)  # 0.3 + 1.6 s: admitted


def test_a_new_objective_holds_for_the_next_runs_and_keeps_what_was_measured() -> None:
    queue, clock = measured_prefill_queue(100, objective=None)
    waiting = queue.enter(150)  # 1.5 s: admitted with no objective
    queue.set_objective(1.0)
    assert queue.objective == 1.0
    with pytest.raises(OverloadedError, match="1 s objective"):
        queue.enter(10)  # 1.6 s at the rate measured before the change
    assert queue.waiting == 1 and queue.rate() == 100.0  # the admitted run keeps its place
    queue.set_objective(None)
    queue.enter(10).close()
    clock.now += 1.5
    waiting.started()
    assert queue.waiting == 0 and queue.tokens == 0


def test_runs_of_unknown_size_or_without_a_first_token_give_no_rate() -> None:
    # An upstream with no tokenizer: prompt sizes are 0; runs that all failed drained nothing.
    clock = Clock(0.0)
    queue = PrefillQueue(QueueConfig(objective=1.0, min_samples=1), clock)
    for finish in ("started", "close"):
        ticket = queue.enter(0)
        clock.now += 1.0
        getattr(ticket, finish)()
    assert queue.rate() is None and queue.expected_wait(100) is None
    queue.enter(100)  # admitted: nothing to go by


def test_the_lateness_rises_fast_and_falls_slowly_so_it_follows_the_late_tail() -> None:
    clock = Clock(0.0)
    config = QueueConfig(
        objective=None, min_samples=1, learning=0.5, easing=0.125, lateness_half_life=math.inf
    )
    queue = PrefillQueue(config, clock)
    first = queue.enter(100)
    clock.now += 1.0
    first.started()  # 100 tokens a second: 1 s foretold for the next one alone
    late = queue.enter(100)
    clock.now += 1.8
    late.started()  # 0.8 s late
    assert queue.lateness == pytest.approx(0.4)
    rate = queue.rate()
    assert rate is not None
    on_time = queue.enter(100)
    clock.now += 100 / rate + 0.4  # exactly as foretold, lateness included
    on_time.started()
    early = queue.enter(100)
    clock.now += 0.1
    early.started()  # sooner than foretold: 0 late, the lateness eases by an eighth
    assert queue.lateness == pytest.approx(0.4 * (1 - 0.125))


def day_of_arrivals(queue: PrefillQueue, clock: Clock, seconds: int) -> list[float]:
    """One 100-token run a second, each served at 100 tokens a second; when each refused."""
    refused: list[float] = []
    for _ in range(seconds):
        clock.now += 1.0
        try:
            ticket = queue.enter(100)
        except OverloadedError:
            refused.append(clock.now)
            continue
        clock.now += 0.5
        ticket.started()
    return refused


def test_one_first_token_far_later_than_foretold_does_not_latch_the_objective_shut() -> None:
    clock = Clock(0.0)
    queue = PrefillQueue(QueueConfig(objective=2.0, min_samples=1), clock)
    first = queue.enter(100)
    clock.now += 0.5
    first.started()  # 200 tokens a second
    late = queue.enter(100)
    clock.now += 12.5
    late.started()  # 12 s later than foretold: a learnt lateness of 2.4 s, capped at 1 s
    assert queue.lateness == pytest.approx(1.0)
    # Without ageing, the cap and the trickle, every one of these was refused (the only
    # runs that could lower the lateness were the ones it refused).
    refused = day_of_arrivals(queue, clock, 86_400)
    assert len(refused) < 60
    assert not refused or refused[-1] < clock.now - 86_000


def test_the_learnt_lateness_halves_with_each_half_life_and_is_capped_by_the_objective() -> None:
    clock = Clock(0.0)
    config = QueueConfig(objective=10.0, min_samples=1, learning=1.0, lateness_half_life=30.0)
    queue = PrefillQueue(config, clock)
    first = queue.enter(100)
    clock.now += 1.0
    first.started()
    late = queue.enter(100)
    clock.now += 5.0
    late.started()  # 4 s later than the 1 s foretold
    assert queue.lateness == pytest.approx(4.0)
    clock.now += 30.0
    assert queue.lateness == pytest.approx(2.0)
    clock.now += 60.0
    assert queue.lateness == pytest.approx(0.5)
    capped = PrefillQueue(QueueConfig(objective=1.0, min_samples=1, learning=1.0), clock)
    first = capped.enter(100)
    clock.now += 1.0
    first.started()
    late = capped.enter(100)
    clock.now += 5.0
    late.started()
    assert capped.lateness == pytest.approx(0.5)  # half the 1 s objective


def test_with_nothing_waiting_one_run_a_trickle_is_admitted_whatever_the_estimate() -> None:
    queue, clock = measured_prefill_queue(10, objective=1.0)  # 10 tokens a second
    clock.now += 5.0
    trickle = queue.enter(100)  # 10 s expected, but nothing waits and nothing came for 1 s
    with pytest.raises(OverloadedError):
        queue.enter(1)  # one waits now: refused as before
    clock.now += 10.0
    trickle.started()
    again = queue.enter(100)  # nothing waits, and the last was admitted 10 s ago
    again.started()
    with pytest.raises(OverloadedError):
        queue.enter(100)  # nothing waits, but one was admitted less than a second ago
    clock.now += 1.0
    assert queue.enter(100).tokens == 100


def test_runs_marked_as_not_learning_teach_neither_the_lateness_nor_the_rate() -> None:
    queue, clock = measured_prefill_queue(100, objective=None)
    compiled = queue.enter(100, learns=False)
    clock.now += 3.0  # a grammar compiled before the first token
    compiled.started()
    assert queue.lateness == 0.0
    assert queue.rate() == pytest.approx(100.0)
    assert queue.waiting == 0 and queue.tokens == 0


def test_departures_older_than_the_rate_age_no_longer_count() -> None:
    clock = Clock(0.0)
    queue = PrefillQueue(QueueConfig(objective=1.0, min_samples=2, rate_age=300.0), clock)
    for _ in range(2):  # an engine measured slow: 10 tokens a second
        ticket = queue.enter(10)
        clock.now += 1.0
        ticket.started()
    assert queue.rate() == pytest.approx(10.0)
    waiting = queue.enter(1)  # one waits: no trickle
    with pytest.raises(OverloadedError):
        queue.enter(100)  # 10 s expected against a 1 s objective
    clock.now += 300.0  # the first departure is now more than 300 s old
    assert queue.rate() is None  # one left, fewer than min_samples: cold again
    assert queue.enter(100).tokens == 100
    assert queue.waiting == 2
    waiting.close()


def test_a_run_waits_only_behind_its_engine_priority_and_lower() -> None:
    queue, _ = measured_prefill_queue(100, objective=2.0)  # 100 tokens a second
    queue.enter(150, priority=5, key="low")  # 1.5 s of backlog, ranked after
    # A run ranked before it (a lower value) does not wait behind it: 0.5 s, admitted.
    assert queue.enter(50, priority=1, key="high").tokens == 50
    assert queue.backlog(1, "high").tokens == 50 and queue.backlog(5, "low").tokens == 200
    # One ranked with it or after waits behind all: 1.5 + 0.5 + 1.0 s, past 2 s (and the
    # key holds the whole backlog ahead of it).
    with pytest.raises(OverloadedError):
        queue.enter(100, priority=5, key="low")


def test_the_key_holding_the_backlog_is_refused_before_the_others() -> None:
    queue, _ = measured_prefill_queue(100, objective=2.0)  # 100 tokens a second
    queue.enter(180, key="flood")
    # 1.8 + 0.5 s: past the objective; the flood's key holds the backlog, refused.
    with pytest.raises(OverloadedError):
        queue.enter(50, key="flood")
    # Another key is admitted up to 1.5 times the objective (3 s): 2.3 s.
    assert queue.enter(50, key="quiet").tokens == 50
    backlog = queue.backlog(0, "quiet")
    assert (backlog.tokens, backlog.own_tokens, backlog.keys) == (230, 50, 2)
    assert not backlog.holds_tokens and queue.backlog(0, "flood").holds_tokens
    # Past the slack, the others are refused too: 2.3 + 1.0 s.
    with pytest.raises(OverloadedError):
        queue.enter(100, key="third")


class RetriedEngine(FakeEngine):
    """A fake engine whose every run came after a failed try (as an upstream's retry)."""

    async def generate(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def,override]
        async for step in super().generate(*args, **kwargs):  # type: ignore[arg-type]
            yield dataclasses.replace(step, retried=True)


def test_through_the_app_retried_runs_teach_the_estimate_nothing() -> None:
    engine = RetriedEngine(delays=[0.05, 0.0])
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(fake_app(engine, ttft_objective=0.01)) as client:
        # As slow as the runs that get the ninth refused above, but each one retried: the
        # rate is never learnt from them, so nothing is refused.
        for _ in range(10):
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert len(engine.requests) == 10


def test_forgotten_measurements_leave_the_queue_as_on_a_new_engine() -> None:
    """What a run stopped early teaches (time with runs waiting and nothing drained) is gone
    after `forget`: nothing is refused until the rate is measured again, from the departures
    after it alone; the runs waiting keep their places."""
    queue, clock = measured_prefill_queue(100, objective=None)
    cancelled = [queue.enter(100) for _ in range(3)]
    clock.now += 20.0
    for ticket in cancelled[:2]:
        ticket.close()  # cancelled before their first tokens: 20 s busy, nothing drained
    assert queue.rate() == pytest.approx(100 / 21)
    queue.set_objective(1.0)
    with pytest.raises(OverloadedError):
        queue.enter(10)
    queue.forget()
    assert queue.rate() is None and queue.lateness == 0.0
    assert queue.waiting == 1 and queue.tokens == 100
    admitted = [queue.enter(100) for _ in range(10)]  # cold: all admitted
    for ticket in [cancelled[2], *admitted]:
        clock.now += 1.0
        ticket.started()
    assert queue.rate() == pytest.approx(100.0)  # the time before the reset is not counted
    # The run waiting across the reset (foretold 3 s by the forgotten rate, its first token
    # 21 s after it entered) taught no lateness; the others entered with no rate to go by.
    assert queue.lateness == 0.0

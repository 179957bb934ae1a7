"""Admission by the engine's state (`inference.load_limits`): each bound refuses at once
with a 503 and a Retry-After from the drain time; through the app with the fake engine, a
refused request never reaches the engine and is counted by reason."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from sluicegate.engine.protocol import EngineLoad
from sluicegate.errors import OverloadedError
from sluicegate.inference.load_limits import LoadLimits
from sluicegate.inference.prefill_queue import PrefillQueue, QueueConfig
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, measured_prefill_queue

BUSY = EngineLoad(waiting=4, running=10, kv_cache_usage=0.5)


@pytest.mark.parametrize(
    ("limits", "words"),
    [
        (LoadLimits(max_waiting=4), "4 requests are waiting for the engine ahead of this one"),
        (LoadLimits(max_running=14), "runs or is about to run 14 requests (at most 14"),
        (LoadLimits(max_kv_cache_usage=0.5), "KV cache is 50% full (new requests stop at 50%)"),
    ],
)
def test_each_bound_refuses_at_the_state_it_names(limits: LoadLimits, words: str) -> None:
    with pytest.raises(OverloadedError) as refused:
        limits.check(BUSY, drain_seconds=None)
    assert refused.value.status_code == 503
    assert words in str(refused.value)
    assert refused.value.headers == {"retry-after": "1"}


def test_below_every_bound_or_with_no_state_known_nothing_is_refused() -> None:
    LoadLimits(max_waiting=5, max_running=15, max_kv_cache_usage=0.51).check(BUSY, None)
    LoadLimits(max_waiting=0, max_running=1, max_kv_cache_usage=0.01).check(None, None)
    LoadLimits().check(EngineLoad(10**6, 10**6, 1.0), None)
    assert not LoadLimits().any and LoadLimits(max_running=3).any


@pytest.mark.parametrize(("drain", "retry"), [(0.2, "1"), (7.3, "8"), (500.0, "60")])
def test_retry_after_is_the_time_to_drain_what_waits(drain: float, retry: str) -> None:
    with pytest.raises(OverloadedError) as refused:
        LoadLimits(max_waiting=1).check(BUSY, drain_seconds=drain)
    assert refused.value.headers == {"retry-after": retry}


def test_the_queue_tells_its_drain_time() -> None:
    queue, _ = measured_prefill_queue(100, objective=None)
    assert queue.drain_seconds() == 0.0
    queue.enter(250)
    assert queue.drain_seconds() == pytest.approx(2.5)
    assert PrefillQueue(QueueConfig()).drain_seconds() is None


def test_through_the_app_a_full_engine_refuses_before_any_engine_work() -> None:
    engine = FakeEngine()
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(fake_app(engine, max_engine_waiting=2, max_kv_cache_usage=0.9)) as client:
        before = refusals(client.get("/metrics").text)
        assert client.post("/v1/chat/completions", json=body).status_code == 200  # no state
        engine.engine_load = EngineLoad(waiting=1, running=3, kv_cache_usage=0.2)
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        engine.engine_load = EngineLoad(waiting=2, running=3, kv_cache_usage=0.2)
        refused = client.post("/v1/chat/completions", json={**body, "stream": True})
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "overloaded"
        assert refused.headers["retry-after"] == "1"
        engine.engine_load = EngineLoad(waiting=0, running=3, kv_cache_usage=0.95)
        completion = {"model": FAKE_MODEL, "prompt": "a"}
        assert client.post("/v1/completions", json=completion).status_code == 503
        after = refusals(client.get("/metrics").text)
    assert len(engine.requests) == 2
    counted = {reason: after[reason] - before.get(reason, 0.0) for reason in after}
    assert counted["engine_waiting"] == 1 and counted["kv_cache"] == 1
    assert counted["engine_running"] == 0


def refusals(exposition: str) -> dict[str, float]:
    found = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == "sluicegate_admission_refused_total":
                found[sample.labels["reason"]] = sample.value
    return found


def test_a_busy_engines_step_in_progress_counts_against_the_objective() -> None:
    queue, clock = measured_prefill_queue(100, objective=2.0)
    assert queue.expected_wait(150, in_step=0.4) == pytest.approx(1.9)
    first = queue.enter(150, in_step=0.4)  # 0.4 s to the end of the step + 1.5 s of queue
    with pytest.raises(OverloadedError):
        queue.enter(20, in_step=0.4)  # 0.4 + 1.7 s
    queue.enter(20)  # handed to an idle engine: 1.7 s
    # The step was part of what was foretold: a first token that came with it is not late.
    clock.now += 1.9
    first.started()
    assert queue.lateness == 0.0


def test_the_engine_bounds_count_the_waiting_ahead_and_refuse_the_holder_first() -> None:
    from sluicegate.inference.prefill_queue import Backlog

    load = EngineLoad(waiting=4, running=10, kv_cache_usage=0.1)
    limits = LoadLimits(max_waiting=4)
    # All four waiting are one key's: that key is refused; another only past 1.5 x 4.
    flood = Backlog(tokens=400, runs=4, own_tokens=400, own_runs=4, keys=1, all_runs=4)
    with pytest.raises(OverloadedError):
        limits.check(load, None, flood)
    other = Backlog(tokens=400, runs=4, own_tokens=0, own_runs=0, keys=2, all_runs=4)
    limits.check(load, None, other)
    with pytest.raises(OverloadedError):
        limits.check(EngineLoad(waiting=6, running=10, kv_cache_usage=0.1), None, other)
    # A higher-ranked request waits behind none of them (vLLM's priority scheduling).
    ahead_of_all = Backlog(tokens=0, runs=0, own_tokens=0, own_runs=0, keys=1, all_runs=4)
    limits.check(load, None, ahead_of_all)
    LoadLimits(max_running=12).check(load, None, ahead_of_all)  # 10 running + 0 ahead
    # Waiting requests the gateway does not know of count for everyone.
    unknown = Backlog(tokens=0, runs=0, own_tokens=0, own_runs=0, keys=1, all_runs=0)
    with pytest.raises(OverloadedError):
        limits.check(load, None, unknown)

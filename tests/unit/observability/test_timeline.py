"""The request timeline: phases between the marks that are set, observed for generations
only, and as span events at their own times."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from sluicegate.observability.record import RequestRecord
from sluicegate.observability.timeline import PHASES, add_events, observe, phases
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app
from tests.support.metrics import local_value


def test_phases_run_from_each_mark_to_the_next_one_set() -> None:
    record = RequestRecord(started=10.0)
    record.prepared, record.handed, record.first_token, record.first_byte = 10.5, 11, 13, 13.25
    assert list(phases(record)) == [
        ("prepare", 0.5),
        ("wait", 0.5),
        ("deliver", 2.0),  # no engine times (an upstream): from the hand-off
        ("write", 0.25),
    ]
    record.queued, record.scheduled, record.engine_first_token = 11.25, 12, 12.75
    assert dict(phases(record)) == {
        "prepare": 0.5,
        "wait": 0.5,
        "hand_off": 0.25,
        "queue": 0.75,
        "prefill": 0.75,
        "deliver": 0.25,
        "write": 0.25,
    }
    assert sum(dict(phases(record)).values()) == record.first_byte - record.started


def test_a_mark_before_the_one_before_it_makes_no_negative_phase() -> None:
    # Another host's engine clock may be a little behind ours.
    record = RequestRecord(started=0.0)
    record.handed, record.queued, record.scheduled = 1.0, 0.9, 1.5
    assert dict(phases(record)) == {"wait": 1.0, "hand_off": 0.0, "queue": 0.5}


def count(phase: str, model: str = "timeline-model") -> float:
    labels = {"model": model, "phase": phase}
    return local_value("sluicegate_request_phase_seconds_count", **labels)


def test_only_requests_that_reached_the_engine_are_observed() -> None:
    hit = RequestRecord(started=0.0)
    hit.prepared, hit.first_byte = 0.001, 0.002  # a cache hit: no first token
    before = count("prepare")
    observe(hit, "timeline-model")
    assert count("prepare") == before
    generation = RequestRecord(started=0.0)
    generation.prepared, generation.first_token = 0.001, 0.01
    observe(generation, "timeline-model")
    assert count("prepare") == before + 1


class Recording:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        assert timestamp is not None
        self.events.append((name, timestamp))


def test_marks_become_span_events_at_their_own_times() -> None:
    record = RequestRecord(started=100.0)
    record.prepared, record.handed, record.first_token = 100.002, 100.003, 100.5
    span = Recording()
    add_events(span, record)  # type: ignore[arg-type]
    names = [name for name, _ in span.events]
    assert names == ["prepared", "handed", "first_token"]
    times = [at for _, at in span.events]
    assert abs((times[1] - times[0]) - 1_000_000) < 1_000
    assert abs((times[2] - times[1]) - 497_000_000) < 1_000


def test_a_generation_through_the_app_observes_its_phases() -> None:
    """The fake engine reports its own times as vLLM's does: every phase is observed once
    per generation, and a cache hit of it adds none."""
    engine = FakeEngine(delays=[0.05, 0.0, 0.0])
    phase_names = [phase for phase, _ in PHASES]
    before = {phase: count(phase, FAKE_MODEL) for phase in phase_names}
    prefill_before = prefill_seconds()
    body = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    with TestClient(fake_app(engine)) as client:
        assert client.post("/v1/chat/completions", json=body).headers["x-cache"] == "MISS"
        assert client.post("/v1/chat/completions", json=body).headers["x-cache"] == "HIT"
    assert {phase: count(phase, FAKE_MODEL) - before[phase] for phase in phase_names} == {
        phase: 1.0 for phase in phase_names
    }
    assert prefill_seconds() - prefill_before >= 0.04  # the fake's first step took 0.05 s


def prefill_seconds() -> float:
    labels = {"model": FAKE_MODEL, "phase": "prefill"}
    return local_value("sluicegate_request_phase_seconds_sum", **labels)

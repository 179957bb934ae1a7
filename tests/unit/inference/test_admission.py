"""The admission bounds of the process (`inference.admission`): one admission per engine, a
change applied to every engine, now and later made, the runs admitted before it kept, and
what is logged."""

from __future__ import annotations

import logging

import pytest

from sluicegate.engine.protocol import EngineClient, EngineLoad
from sluicegate.errors import OverloadedError
from sluicegate.inference.admission import Admission, EngineAdmission
from sluicegate.inference.prefill_queue import QueueTicket
from sluicegate.wire.admission import AdmissionBounds
from tests.support.fakes import FakeEngine

LOGGER = "sluicegate.inference.admission"


def engine(load: EngineLoad | None = None) -> EngineClient:
    return FakeEngine(engine_load=load)  # type: ignore[return-value]


def logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What this module logged (another test may have left the root logger at INFO)."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def admit(admission: EngineAdmission) -> QueueTicket:
    return admission.admit(10, 0.0, learns=True, priority=0, key="")


def test_one_admission_per_engine_and_a_change_reaches_every_one() -> None:
    admission = Admission(AdmissionBounds(ttft_objective=2.0))
    first, second = engine(), engine()
    assert admission.of(first) is admission.of(first)
    assert admission.of(first) is not admission.of(second)
    admission.change(AdmissionBounds(ttft_objective=0.5, max_engine_running=4), by="key-a")
    later = admission.of(engine())  # an engine whose first model comes after the change
    for each in (admission.of(first), admission.of(second), later):
        assert each.queue.objective == 0.5
        assert each.limits.max_running == 4 and each.limits.max_waiting is None


def test_a_change_sets_what_it_sends_unsets_its_nulls_and_keeps_the_rest() -> None:
    admission = Admission(AdmissionBounds(ttft_objective=2.0, max_engine_waiting=3))
    change = AdmissionBounds.model_validate({"max_engine_waiting": None, "max_kv_cache_usage": 0.8})
    after = admission.change(change, by="key-a")
    assert after == admission.bounds == AdmissionBounds(ttft_objective=2.0, max_kv_cache_usage=0.8)


def test_a_lowered_bound_refuses_the_next_run_and_keeps_the_admitted_one() -> None:
    busy = EngineLoad(waiting=1, running=2, kv_cache_usage=0.2)
    admission = Admission()
    on_engine = admission.of(engine(busy))
    admitted = on_engine.queue.enter(50)  # a run waiting for its first token
    admit(on_engine)
    admission.change(AdmissionBounds(max_engine_running=3), by="key-a")
    with pytest.raises(OverloadedError, match="at most 3 at once"):
        admit(on_engine)
    assert on_engine.queue.waiting == 2  # the runs admitted before keep their places
    admission.change(AdmissionBounds.model_validate({"max_engine_running": None}), by="key-a")
    admit(on_engine).close()
    admitted.started()
    assert on_engine.queue.waiting == 1


def test_a_change_is_logged_with_who_asked_and_what_it_changed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    admission = Admission(AdmissionBounds(max_engine_waiting=4))
    admission.of(engine(EngineLoad(0, 0, 0.0)))
    with caplog.at_level(logging.INFO, logger=LOGGER):
        admission.change(AdmissionBounds(max_engine_waiting=2, ttft_objective=1.0), by="key-a")
        admission.change(AdmissionBounds(), by="anonymous")
    assert logged(caplog) == [
        "admission bounds changed by key-a: ttft_objective None -> 1.0; max_engine_waiting 4 -> 2",
        "admission bounds changed by anonymous: nothing changed",
    ]


def test_engine_bounds_warn_where_no_engine_reports_its_state(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        unbounded = Admission()
        unbounded.of(engine())  # nothing to warn of
        unbounded.change(AdmissionBounds(ttft_objective=1.0), by="key-a")  # it binds upstreams
        assert not logged(caplog)
        unbounded.change(AdmissionBounds(max_engine_running=2), by="key-a")
        assert len(logged(caplog)) == 1 and "upstreams report none" in logged(caplog)[0]
        bounded = Admission(AdmissionBounds(max_kv_cache_usage=0.9))
        bounded.of(engine(EngineLoad(0, 0, 0.0)))
        bounded.change(AdmissionBounds(max_engine_waiting=1), by="key-a")
        assert len(logged(caplog)) == 1  # an engine reports it: the bounds bind there
        bounded.of(engine())
        assert len(logged(caplog)) == 2

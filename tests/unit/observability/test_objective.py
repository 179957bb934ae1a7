"""The service objective (`SLO_TTFT`, `SLO_ITL`): each request judged as it ends, as the tune
judges a trial's requests, and counted for the dashboard's attainment (over the app with the
fake engine)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sluicegate.observability.objective import ServiceObjective
from sluicegate.observability.record import RequestRecord
from sluicegate.settings import Settings
from sluicegate.tuning.objective import Objective
from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, fake_app
from tests.support.metrics import local_value

CHAT = "/v1/chat/completions"


def judged(outcome: str) -> float:
    return local_value("sluicegate_objective_requests_total", model=FAKE_MODEL, outcome=outcome)


def record(ttft: float | None, gaps: list[float], bound: float = 0.3) -> RequestRecord:
    made = RequestRecord(started=100.0, slow_gap=bound)
    if ttft is not None:
        made.first_token = 100.0 + ttft
    made.gaps = len(gaps)
    made.slow_gaps = sum(gap > bound for gap in gaps)
    return made


@pytest.mark.parametrize(
    ("ttft", "gaps", "status", "outcome"),
    [
        (0.5, [0.1] * 20, 200, "met"),
        (2.5, [0.1] * 20, 200, "missed"),  # first token too late
        (0.5, [0.1] * 18 + [0.9] * 2, 200, "met"),  # 2 of 20 slow: the P90 is still 0.1
        (0.5, [0.1] * 17 + [0.9] * 3, 200, "missed"),  # 3 of 20: the P90 is 0.9
        (0.5, [], 200, "met"),  # one token: no gap to judge
        (None, [], 503, "refused"),
        (None, [], 429, "refused"),
        (None, [], 500, "missed"),
        (0.5, [0.1], 502, "missed"),  # a stream cut by a server error
        (None, [], 400, None),  # a bad request says nothing of the service
        (None, [], 404, None),
    ],
)
def test_a_request_is_judged_as_the_tune_judges_it(
    ttft: float | None, gaps: list[float], status: int, outcome: str | None
) -> None:
    objective = ServiceObjective(2.0, 0.3)
    assert objective.judge(record(ttft, gaps), status, now=200.0) == outcome
    if status == 200:
        # The tune's own judgement of the same request agrees.
        assert Objective(2.0, 0.3).met_by(ttft, gaps) == (outcome == "met")


def test_a_client_gone_is_judged_only_past_the_ttft_bound() -> None:
    objective = ServiceObjective(2.0, 0.3)
    assert objective.judge(record(None, []), 499, now=101.0) is None
    assert objective.judge(record(None, []), 499, now=103.0) == "missed"
    assert objective.judge(record(0.5, [0.1]), 499, now=103.0) == "met"
    assert ServiceObjective(2.0).judge(record(0.5, [0.1] * 3 + [5.0] * 7), 200) == "met"


def test_the_gateway_counts_its_requests_against_the_objective() -> None:
    # Each answer: its first token after 0.05 s, then a gap of 0.3 s (the SLO_ITL is 0.2 s)
    # and one of 0: one slow gap in two, a P90 of 0.3.
    engine = FakeEngine(delays=[0.05, 0.3, 0.0])
    app = fake_app(engine, slo_ttft=1.0, slo_itl=0.2)
    before = {outcome: judged(outcome) for outcome in ("met", "missed", "refused")}
    with TestClient(app) as client:
        assert client.post(CHAT, json=chat_body(stream=True)).status_code == 200
        engine.delays = [0.05, 0.0, 0.0]
        assert client.post(CHAT, json=chat_body(stream=True)).status_code == 200
        assert client.post(CHAT, json=chat_body()).status_code == 200
        assert client.post(CHAT, json={"model": FAKE_MODEL}).status_code == 400
    assert judged("met") == before["met"] + 2
    assert judged("missed") == before["missed"] + 1
    assert judged("refused") == before["refused"]


def test_without_an_objective_nothing_is_judged() -> None:
    before = judged("met")
    with TestClient(fake_app(FakeEngine())) as client:
        assert client.post(CHAT, json=chat_body()).status_code == 200
    assert judged("met") == before


def test_an_itl_bound_needs_a_ttft_bound() -> None:
    with pytest.raises(ValidationError, match="SLO_ITL needs SLUICEGATE_SLO_TTFT"):
        Settings(slo_itl=0.3, _env_file=None)  # type: ignore[call-arg]

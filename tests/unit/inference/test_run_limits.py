"""The per-request bounds of `RequestLimits` that come from settings: stop sequences (their
count and length) and `min_tokens` against `max_tokens`, over the app with the fake engine."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.settings import Settings
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app

CHAT = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}


def post(client: TestClient, **extra: Any) -> tuple[int, dict[str, Any]]:
    response = client.post("/v1/chat/completions", json={**CHAT, **extra})
    return response.status_code, response.json()


def test_stop_defaults_are_generous_but_bounded() -> None:
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert (settings.max_stop_sequences, settings.max_stop_length) == (64, 1024)


@pytest.mark.parametrize(
    "stop",
    [
        [f"s{i}" for i in range(5)],  # one more than allowed
        ["ok", "x" * 9],  # one string too long
        "x" * 9,  # a lone string too long
        [f"s{i}" for i in range(200_000)],  # the black-box report: never reaches the engine
    ],
)
def test_too_many_or_too_long_stop_sequences_are_a_400(stop: str | list[str]) -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine, max_stop_sequences=4, max_stop_length=8)) as client:
        status, body = post(client, stop=stop)
    assert status == 400, body
    assert body["error"]["param"] == "stop"
    assert body["error"]["type"] == "invalid_request_error"
    assert engine.requests == []


def test_stop_sequences_at_the_limits_reach_the_engine() -> None:
    engine = FakeEngine()
    stop = ["x" * 8, "a", "b", "c"]
    with TestClient(fake_app(engine, max_stop_sequences=4, max_stop_length=8)) as client:
        status, body = post(client, stop=stop)
    assert status == 200, body
    assert engine.requests[0][2].stop == tuple(stop)


def test_the_completions_route_has_the_same_stop_bounds() -> None:
    with TestClient(fake_app(max_stop_sequences=1)) as client:
        response = client.post(
            "/v1/completions", json={"model": FAKE_MODEL, "prompt": "hi", "stop": ["a", "b"]}
        )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stop"


def test_min_tokens_above_max_tokens_is_a_400_naming_min_tokens() -> None:
    engine = FakeEngine()
    with TestClient(fake_app(engine)) as client:
        status, body = post(client, max_tokens=2, min_tokens=3)
        assert status == 400, body
        assert body["error"]["param"] == "min_tokens"
        status, body = post(client, max_completion_tokens=2, max_tokens=9, min_tokens=3)
        assert status == 400, body
        assert body["error"]["param"] == "min_tokens"
        status, body = post(client, max_tokens=3, min_tokens=3)
        assert status == 200, body
    assert engine.requests[0][2].min_tokens == 3

"""Rate limits through the app (fake engine, in-process limiter)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.support.fakes import FAKE_MODEL, fake_app

MODEL = FAKE_MODEL
KEY = "sk-quota-test"


def client_for(**settings: object) -> TestClient:
    return TestClient(fake_app(**settings))


def chat(**extra: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], **extra}


@pytest.fixture
def limited() -> Iterator[TestClient]:
    with client_for(rate_limit_requests_per_minute=2) as client:
        yield client


def test_requests_per_minute_end_in_a_429_with_openai_headers(limited: TestClient) -> None:
    first = limited.post("/v1/chat/completions", json=chat())
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert "x-ratelimit-reset-requests" in first.headers
    assert limited.post("/v1/completions", json={"model": MODEL, "prompt": "x"}).status_code == 200
    refused = limited.post("/v1/chat/completions", json=chat(stream=True))
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


def test_streams_carry_the_headers_and_settle_their_tokens() -> None:
    # 4 prompt tokens ("user a b c") and max_tokens 5 reserved up front; the stream's 3
    # completion tokens settled at the end, the 2 it did not use given back.
    with client_for(rate_limit_tokens_per_minute=14) as client:
        first = client.post("/v1/chat/completions", json=chat(stream=True, max_tokens=5))
        assert first.status_code == 200
        assert first.headers["x-ratelimit-remaining-tokens"] == "5"
        refused = client.post("/v1/chat/completions", json=chat(max_tokens=4))
        assert refused.status_code == 429, "the first stream's completion tokens were settled"
        assert "tokens" in refused.json()["error"]["message"]
        fits = client.post("/v1/chat/completions", json=chat(max_tokens=3))
        assert fits.status_code == 200, "the unused reservation was given back"


def test_overrides_apply_by_key_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluicegate.keys import ApiKeyring

    key_id = ApiKeyring.parse(KEY).identify(KEY)
    assert key_id is not None
    # As operators set it: JSON in the environment.
    overrides = json.dumps({key_id: {"requests_per_minute": 1}})
    monkeypatch.setenv("SLUICEGATE_RATE_LIMIT_OVERRIDES", overrides)
    with client_for(api_keys=KEY, rate_limit_requests_per_minute=100) as client:
        auth = {"authorization": f"Bearer {KEY}"}
        assert client.post("/v1/chat/completions", json=chat(), headers=auth).status_code == 200
        assert client.post("/v1/chat/completions", json=chat(), headers=auth).status_code == 429


def test_no_limits_no_headers() -> None:
    with client_for() as client:
        response = client.post("/v1/chat/completions", json=chat())
        assert response.status_code == 200
        assert not any(h.startswith("x-ratelimit") for h in response.headers)


def test_a_key_over_its_rate_is_refused_before_its_body_is_parsed(limited: TestClient) -> None:
    assert limited.post("/tokenize", json={"prompt": "x"}).status_code == 200  # counted
    assert limited.post("/v1/chat/completions", json=chat()).status_code == 200
    # Invalid bodies, small and large (the parse process), get the 429, not their 400.
    for body in ({"model": MODEL, "messages": "nope"}, {"model": MODEL, "x": "y" * 300_000}):
        refused = limited.post("/v1/chat/completions", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"


def test_a_request_is_counted_once_though_it_is_checked_twice() -> None:
    with client_for(rate_limit_requests_per_minute=3) as client:
        remaining = [
            client.post("/v1/chat/completions", json=chat()).headers[
                "x-ratelimit-remaining-requests"
            ]
            for _ in range(3)
        ]
        assert remaining == ["2", "1", "0"]
        assert client.post("/v1/chat/completions", json=chat()).status_code == 429

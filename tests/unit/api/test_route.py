"""`api.route.LargeBodyRoute`: large bodies are parsed in the worker process, with the same
answers as bodies FastAPI parses itself (fake engine)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.api.route import LARGE_BODY_BYTES
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app

JSON = {"content-type": "application/json"}


def post(http: TestClient, body: bytes) -> httpx.Response:
    return http.post("/v1/chat/completions", headers=JSON, content=body)


@pytest.fixture(scope="module")
def client() -> Iterator[tuple[TestClient, FakeEngine]]:
    engine = FakeEngine(max_model_len=1_000_000)
    with TestClient(fake_app(engine, max_request_bytes=16 * 1024 * 1024)) as test_client:
        yield test_client, engine


def many_parts(count: int, **extra: object) -> bytes:
    parts = [{"type": "text", "text": "word"}] * count
    body = {"model": FAKE_MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": parts}]}
    return json.dumps({**body, **extra}).encode()


def test_a_large_body_of_many_parts_is_parsed_and_joined_as_a_small_one_would_be(
    client: tuple[TestClient, FakeEngine],
) -> None:
    http, engine = client
    body = many_parts(20_000)
    assert len(body) > LARGE_BODY_BYTES
    response = post(http, body)
    assert response.status_code == 200, response.text
    # The fake tokenizer gives one id per word: the parts arrived joined, all of them.
    assert len(engine.requests[-1][1]) == 20_000 + 1  # and the role


def test_a_large_invalid_body_gets_the_same_400_as_a_small_one(
    client: tuple[TestClient, FakeEngine],
) -> None:
    http, _ = client
    small = post(http, many_parts(2, temperature=7))
    large = http.post(
        "/v1/chat/completions", headers=JSON, content=many_parts(20_000, temperature=7)
    )
    assert small.status_code == large.status_code == 400
    assert small.json() == large.json()
    assert large.json()["error"]["param"] == "temperature"


def test_a_large_body_that_is_not_json_is_a_400(client: tuple[TestClient, FakeEngine]) -> None:
    http, _ = client
    response = http.post(
        "/v1/chat/completions", headers=JSON, content=b"{" + b" " * LARGE_BODY_BYTES
    )
    assert response.status_code == 400
    assert "could not parse the JSON body" in response.json()["error"]["message"]


def test_the_event_loop_lag_is_measured(client: tuple[TestClient, FakeEngine]) -> None:
    http, _ = client
    text = http.get("/metrics").text
    assert "sluicegate_event_loop_lag_seconds_bucket" in text

"""Gateway behaviour around the engine, with the fake engine (no vLLM, no model)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from sluicegate.errors import EngineUnavailableError, InvalidRequestError
from tests.support.fakes import FAKE_MODEL, FakeEngine, chat_body, fake_app
from tests.support.sse import sse_data

MODEL = FAKE_MODEL


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(fake_app(engine)) as test_client:
        yield test_client


def test_non_streamed_chat_response_shape(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", json=chat_body()).json()
    assert body["object"] == "chat.completion"
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there!"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def test_default_max_tokens_is_a_share_of_what_the_context_leaves(
    client: TestClient, engine: FakeEngine
) -> None:
    client.post("/v1/chat/completions", json=chat_body())
    _, prompt, options = engine.requests[-1]
    # The default reserve ratio holds back 30% of what the prompt leaves.
    assert options.max_tokens == int((engine.max_model_len - len(prompt)) * 0.7)
    assert (options.temperature, options.top_p, options.n) == (1.0, 1.0, 1)


def test_developer_role_is_sent_as_system(client: TestClient, engine: FakeEngine) -> None:
    body = chat_body(
        messages=[{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}]
    )
    client.post("/v1/chat/completions", json=body)
    _, prompt, _ = engine.requests[-1]
    assert prompt == [len("system"), 1, len("user"), 1]


def test_stream_order_role_content_finish_usage_done(client: TestClient) -> None:
    response = client.post(
        "/v1/chat/completions",
        json=chat_body(stream=True, stream_options={"include_usage": True}),
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_data(response.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] == [
        "Hello",
        " there",
        "!",
    ]
    assert chunks[4]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["completion_tokens"] == 3
    assert all(c["usage"] is None for c in chunks[:5])


def test_error_before_output_keeps_its_status_even_when_streaming(
    client: TestClient, engine: FakeEngine
) -> None:
    engine.fail_before_output = EngineUnavailableError()
    for stream in (False, True):
        response = client.post("/v1/chat/completions", json=chat_body(stream=stream))
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_unavailable"
    engine.fail_before_output = InvalidRequestError("refused", param="prompt")
    response = client.post(
        "/v1/completions", json={"model": MODEL, "prompt": "a b", "stream": True}
    )
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt"


def test_error_after_first_byte_is_an_error_event_then_done(
    client: TestClient, engine: FakeEngine
) -> None:
    engine.fail_after_words = 2
    response = client.post("/v1/chat/completions", json=chat_body(stream=True))
    assert response.status_code == 200
    events = sse_data(response.text)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_unavailable"
    assert set(error) == {"message", "type", "param", "code"}
    contents = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-2]]
    assert contents == ["", "Hello", " there"]


def test_completion_batch_indexes_choices_per_prompt_and_n(
    client: TestClient, engine: FakeEngine
) -> None:
    body = {"model": MODEL, "prompt": ["a", "b c"], "n": 2, "temperature": 0.7, "max_tokens": 2}
    result = client.post("/v1/completions", json=body).json()
    assert [c["index"] for c in result["choices"]] == [0, 1, 2, 3]
    assert all(
        c["text"] == "Hello there" and c["finish_reason"] == "length" for c in result["choices"]
    )
    assert result["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    assert len({r[0] for r in engine.requests}) == 2, "each prompt has its own engine request id"


def test_every_request_gets_its_own_engine_request_id(
    client: TestClient, engine: FakeEngine
) -> None:
    for _ in range(3):
        client.post("/v1/chat/completions", json=chat_body(), headers={"x-request-id": "same"})
    assert len({r[0] for r in engine.requests}) == 3


def test_engine_requests_carry_the_time_the_gateway_began_preparing_them(
    client: TestClient, engine: FakeEngine
) -> None:
    # The engine's own latency metrics count from it, so they include the gateway's share.
    before = time.time()
    client.post("/v1/chat/completions", json=chat_body(stream=True))
    middle = time.time()
    body = {"model": MODEL, "prompt": ["a", "b c"], "max_tokens": 2}
    client.post("/v1/completions", json=body)
    after = time.time()
    chat, *batch = engine.arrivals
    assert before <= chat <= middle
    assert len(batch) == 2 and batch[0] == batch[1], "one arrival for every prompt of a request"
    assert middle <= batch[0] <= after


def test_ready_follows_engine_health(client: TestClient, engine: FakeEngine) -> None:
    assert client.get("/ready").status_code == 200
    engine.healthy = False
    response = client.get("/ready")
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "service_unavailable_error"
    assert client.get("/health").status_code == 200


def test_max_tokens_over_the_context_is_clamped(client: TestClient, engine: FakeEngine) -> None:
    response = client.post("/v1/chat/completions", json=chat_body(max_tokens=100))
    assert response.status_code == 200
    _, prompt, options = engine.requests[-1]
    assert options.max_tokens == engine.max_model_len - len(prompt) == 61
    assert response.headers["x-budget-max-tokens"] == "61"
    assert response.headers["x-budget-max-tokens-source"] == "clamped"


def test_context_length_error_names_the_numbers(engine: FakeEngine) -> None:
    with TestClient(fake_app(engine, max_tokens_overflow="error")) as client:
        response = client.post("/v1/chat/completions", json=chat_body(max_tokens=100))
    error = response.json()["error"]
    assert response.status_code == 400
    assert error["code"] == "context_length_exceeded"
    assert (
        "64 tokens" in error["message"]
        and "103 tokens (3 in the messages, 100 in the completion)" in error["message"]
    )


def test_unexpected_failure_is_an_openai_500(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_before_output = RuntimeError("boom")  # type: ignore[assignment]
    with TestClient(client.app, raise_server_exceptions=False) as raw:
        response = raw.post("/v1/chat/completions", json=chat_body())
    assert response.status_code == 500
    assert response.json()["error"]["type"] == "server_error"
    assert "boom" not in response.text

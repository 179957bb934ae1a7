"""Anthropic's Messages API over the fake engine: the message object, the stream's events,
errors in Anthropic's shape, keys in `x-api-key`, the cache's share of the usage, count_tokens.
The real engine and Anthropic's SDK are in tests/integration/test_messages.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluicegate.errors import OverloadedError
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app

MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"
KEY = "sk-ant-test-0123456789"


def body(**extra: Any) -> dict[str, Any]:
    return {
        "model": FAKE_MODEL,
        "max_tokens": 16,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Say hello."}],
        **extra,
    }


def events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The stream's events as (name, data), checking each name is its data's type."""
    found = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        found.append((name, data))
    return found


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=["Hello", " there", "!"])


@pytest.fixture
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(fake_app(engine, stream_ping_after=0.2)) as client:
        yield client


def test_a_message_comes_back_as_anthropics_message_object(client: TestClient) -> None:
    response = client.post(MESSAGES, json=body(), headers={"anthropic-version": "2023-06-01"})
    assert response.status_code == 200, response.text
    message = response.json()
    assert message["id"].startswith("msg_") and message["type"] == "message"
    assert message["role"] == "assistant" and message["model"] == FAKE_MODEL
    assert message["content"] == [{"type": "text", "text": "Hello there!"}]
    assert message["stop_reason"] == "end_turn" and message["stop_sequence"] is None
    usage = message["usage"]
    assert usage["output_tokens"] == 3 and usage["input_tokens"] > 0
    assert usage["cache_read_input_tokens"] == 0


def test_max_tokens_and_stop_sequences_give_their_stop_reasons(client: TestClient) -> None:
    cut = client.post(MESSAGES, json=body(max_tokens=2)).json()
    assert cut["stop_reason"] == "max_tokens" and cut["usage"]["output_tokens"] == 2
    stopped = client.post(MESSAGES, json=body(stop_sequences=["!"])).json()
    assert stopped["stop_reason"] == "stop_sequence" and stopped["stop_sequence"] == "!"
    assert stopped["content"][0]["text"] == "Hello there"


def test_a_stream_is_anthropics_event_sequence(client: TestClient) -> None:
    response = client.post(MESSAGES, json=body(stream=True, stop_sequences=["!"]))
    assert response.status_code == 200
    assert "[DONE]" not in response.text
    seen = events(response.text)
    names = [name for name, _ in seen]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = seen[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] > 0 and start["usage"]["output_tokens"] == 0
    assert seen[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    text = "".join(d["delta"]["text"] for n, d in seen if n == "content_block_delta")
    assert text == "Hello there"
    delta = seen[5][1]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "!"}
    assert delta["usage"]["output_tokens"] == 2


def test_a_slow_first_token_is_preceded_by_pings(client: TestClient, engine: FakeEngine) -> None:
    engine.delays = [0.9]
    response = client.post(MESSAGES, json=body(stream=True))
    names = [name for name, _ in events(response.text)]
    assert names[:2] == ["message_start", "ping"]
    assert names.count("message_start") == 1 and names[-1] == "message_stop"
    assert names.count("ping") >= 2  # one at once, then one every 0.2 s until the token


def test_an_error_after_the_first_byte_is_an_error_event(
    client: TestClient, engine: FakeEngine
) -> None:
    engine.fail_after_words = 1
    response = client.post(MESSAGES, json=body(stream=True))
    assert response.status_code == 200
    name, data = events(response.text)[-1]
    assert name == "error"
    assert data["error"]["type"] == "overloaded_error" and data["error"]["message"]


@pytest.mark.parametrize(
    ("change", "status", "kind", "says"),
    [
        ({"max_tokens": None}, 400, "invalid_request_error", "max_tokens"),
        ({"model": "claude-nope"}, 404, "not_found_error", "claude-nope"),
        ({"temperature": 3}, 400, "invalid_request_error", "temperature"),
        ({"messages": []}, 400, "invalid_request_error", "messages"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image", "source": {"type": "base64", "data": "AA=="}},
                        ],
                    }
                ]
            },
            400,
            "invalid_request_error",
            "a base64 image source needs its media_type and data",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            400,
            "invalid_request_error",
            "document blocks are not supported",
        ),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 2048}},
            400,
            "invalid_request_error",
            "'thinking.budget_tokens': must be less than max_tokens (16)",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            400,
            "invalid_request_error",
            "server tools",
        ),
    ],
)
def test_bad_requests_are_anthropic_errors_with_anthropics_statuses(
    client: TestClient, change: dict[str, Any], status: int, kind: str, says: str
) -> None:
    sent = {k: v for k, v in {**body(), **change}.items() if v is not None}
    response = client.post(MESSAGES, json=sent)
    assert response.status_code == status, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert says in error["error"]["message"]
    assert set(error) == {"type", "error"} and set(error["error"]) == {"type", "message"}


def test_malformed_json_is_an_anthropic_400(client: TestClient) -> None:
    response = client.post(MESSAGES, content=b"{nope", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_an_overloaded_engine_is_anthropics_529(client: TestClient, engine: FakeEngine) -> None:
    engine.fail_before_output = OverloadedError(headers={"retry-after": "1"})
    response = client.post(MESSAGES, json=body())
    assert response.status_code == 529
    assert response.json()["error"]["type"] == "overloaded_error"
    assert response.headers["retry-after"] == "1"


def test_the_key_may_come_as_x_api_key() -> None:
    with TestClient(fake_app(api_keys=KEY)) as client:
        assert client.post(MESSAGES, json=body(), headers={"x-api-key": KEY}).status_code == 200
        bearer = {"authorization": f"Bearer {KEY}"}
        assert client.post(MESSAGES, json=body(), headers=bearer).status_code == 200
        refused = client.post(MESSAGES, json=body(), headers={"x-api-key": "sk-wrong"})
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "authentication_error"
        # Elsewhere the envelope stays OpenAI's.
        chat = {"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]}
        other = client.post("/v1/chat/completions", json=chat)
        assert other.status_code == 401 and other.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("stream", [False, True])
def test_a_cached_answer_says_its_input_was_read_from_the_cache(
    client: TestClient, stream: bool
) -> None:
    sent = body(temperature=0, stream=stream)
    first = client.post(MESSAGES, json=sent)
    second = client.post(MESSAGES, json=sent)
    assert (first.headers["x-cache"], second.headers["x-cache"]) == ("MISS", "HIT")
    if stream:
        usage = events(second.text)[0][1]["message"]["usage"]
        fresh = events(first.text)[0][1]["message"]["usage"]
    else:
        usage, fresh = second.json()["usage"], first.json()["usage"]
    assert usage["input_tokens"] == 0
    assert usage["cache_read_input_tokens"] == fresh["input_tokens"] > 0
    assert fresh["cache_read_input_tokens"] == 0


def test_a_forced_tool_is_a_tool_use_block(engine: FakeEngine) -> None:
    engine.words = ['{"city": ', '"Paris"}']
    tool = {
        "name": "get_weather",
        "description": "The weather in a city.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    sent = body(tools=[tool], tool_choice={"type": "tool", "name": "get_weather"})
    with TestClient(fake_app(engine)) as client:
        message = client.post(MESSAGES, json=sent).json()
        assert message["stop_reason"] == "tool_use"
        (block,) = message["content"]
        assert block["type"] == "tool_use" and block["name"] == "get_weather"
        assert block["input"] == {"city": "Paris"} and block["id"]
        streamed = events(client.post(MESSAGES, json={**sent, "stream": True}).text)
    start = next(d for n, d in streamed if n == "content_block_start")
    assert start["content_block"]["type"] == "tool_use"
    assert start["content_block"]["name"] == "get_weather" and start["content_block"]["input"] == {}
    parts = [
        d["delta"]["partial_json"]
        for n, d in streamed
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    ]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    assert streamed[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_count_tokens_is_what_the_budget_counts(client: TestClient) -> None:
    sent = body()
    counted = client.post(COUNT, json={k: sent[k] for k in ("model", "system", "messages")})
    assert counted.status_code == 200, counted.text
    used = client.post(MESSAGES, json=sent).json()["usage"]["input_tokens"]
    assert counted.json() == {"input_tokens": used}
    unknown = client.post(COUNT, json={**sent, "model": "nope"})
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"


PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC"
)


def pictured(source: dict[str, Any]) -> dict[str, Any]:
    turn = [{"type": "text", "text": "What is it?"}, {"type": "image", "source": source}]
    return body(messages=[{"role": "user", "content": turn}])


def test_image_blocks_reach_a_model_that_reads_them_and_are_counted(
    client: TestClient, engine: FakeEngine
) -> None:
    engine.takes_images = True
    engine.tokens_per_image = 20
    image = {"type": "base64", "media_type": "image/png", "data": PIXEL}
    response = client.post(MESSAGES, json=pictured(image))
    assert response.status_code == 200, response.text
    (prompt,) = engine.prompts
    assert [i.media_type for i in prompt.images] == ["image/png"]
    assert response.json()["usage"]["input_tokens"] == prompt.length
    text_only = client.post(COUNT, json={k: v for k, v in body().items() if k != "max_tokens"})
    counted = client.post(
        COUNT, json={k: v for k, v in pictured(image).items() if k != "max_tokens"}
    )
    assert counted.json()["input_tokens"] > text_only.json()["input_tokens"] + 20 - 1


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ({"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"}, "not a PNG"),
        ({"type": "url", "url": "http://127.0.0.1:9/a.png"}, "a loopback address"),
    ],
)
def test_an_image_refused_names_its_block_in_anthropics_shape(
    client: TestClient, engine: FakeEngine, source: dict[str, Any], words: str
) -> None:
    engine.takes_images = True
    response = client.post(MESSAGES, json=pictured(source))
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith("messages.0.content.1: ")
    assert words in error["error"]["message"]
    assert engine.prompts == []


def test_a_text_only_model_refuses_an_image_block(client: TestClient, engine: FakeEngine) -> None:
    image = {"type": "base64", "media_type": "image/png", "data": PIXEL}
    response = client.post(MESSAGES, json=pictured(image))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "messages.0.content.1" in message and "text only" in message

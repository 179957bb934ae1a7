"""Large Anthropic Messages bodies over the fake engine: parsed and converted to the chat
request in the worker process (the event loop sees the chat turns, not the blocks), the cap
on content blocks per turn (Anthropic's 400), and `/health` answered while a body of
megabytes is worked on (real loopback HTTP)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sluicegate.api.route import LARGE_BODY_BYTES
from sluicegate.wire import messages as wire_messages
from sluicegate.wire.compact import compact_body
from sluicegate.wire.messages import MAX_CONTENT_BLOCKS, CountTokensRequest, MessagesRequest
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, health_silence, serve_in_thread

MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"
JSON = {"content-type": "application/json"}
BODY_LIMIT = 16 * 1024 * 1024
# The longest /health may go unanswered while a huge body is worked on: a stall a user would
# see, with room for a loaded two-core machine (the body is parsed in the worker process).
STALL_BOUND_S = 2.0


def turns(count: int, blocks: int, text: str = "word") -> list[dict[str, Any]]:
    """`count` turns (user, assistant, ..., user) of `blocks` text blocks of `text` each."""
    block = {"type": "text", "text": text}
    roles = ["user", "assistant"]
    return [
        {"role": roles[i % 2], "content": [block] * blocks}
        for i in range(count if count % 2 else count + 1)
    ]


def messages_body(count: int, blocks: int, text: str = "word", **extra: Any) -> bytes:
    body = {"model": FAKE_MODEL, "max_tokens": 3, "messages": turns(count, blocks, text), **extra}
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=10_000_000)


@pytest.fixture(scope="module")
def client(engine: FakeEngine) -> Iterator[TestClient]:
    with TestClient(fake_app(engine, max_request_bytes=BODY_LIMIT)) as client:
        yield client


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times this process (the event loop's) converted turns to chat messages."""
    seen: list[int] = []
    convert = wire_messages.chat_messages

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return convert(*args, **kwargs)

    monkeypatch.setattr(wire_messages, "chat_messages", counted)
    return seen


def test_a_large_messages_body_is_converted_in_the_worker_process(
    client: TestClient, engine: FakeEngine, conversions: list[int]
) -> None:
    body = messages_body(41, 200)
    assert len(body) > LARGE_BODY_BYTES
    answer = client.post(MESSAGES, headers=JSON, content=body)
    assert answer.status_code == 200, answer.text
    assert answer.json()["type"] == "message"
    # Every block's word reached the engine (one id a word), with each turn's role.
    assert len(engine.requests[-1][1]) == 41 * 200 + 41
    counted = client.post(COUNT, headers=JSON, content=body)
    assert counted.status_code == 200, counted.text
    assert counted.json() == {"input_tokens": 41 * 200 + 41}
    assert conversions == [], "the event loop converted the blocks of a large body"
    # A small body is converted where it is parsed, on the loop (a thread hop costs more).
    assert client.post(MESSAGES, headers=JSON, content=messages_body(1, 2)).status_code == 200
    assert conversions == [1]


def test_a_block_the_server_cannot_take_in_a_large_body_is_the_same_400(
    client: TestClient,
) -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    answers = []
    for count in (1, 41):
        sent = json.loads(messages_body(count, 200))
        sent["messages"][-1]["content"][-1] = image
        answers.append(client.post(MESSAGES, headers=JSON, content=json.dumps(sent).encode()))
    small, large = answers
    assert small.status_code == large.status_code == 400, large.text
    assert large.json()["error"]["type"] == "invalid_request_error"
    assert "text only" in large.json()["error"]["message"]


def refusal_of_blocks(client: TestClient, path: str, sent: dict[str, Any], large: bool) -> str:
    """The message of the 400 that refuses `sent` for holding too many blocks, in
    Anthropic's envelope; `large`: the body is parsed in the worker process."""
    payload = json.dumps(sent).encode()
    assert (len(payload) > LARGE_BODY_BYTES) == large
    answer = client.post(path, headers=JSON, content=payload)
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert f"at most {MAX_CONTENT_BLOCKS} content blocks" in error["error"]["message"]
    return str(error["error"]["message"])


@pytest.mark.parametrize("path", [MESSAGES, COUNT])
@pytest.mark.parametrize("count", [1, 41])
def test_a_turn_of_more_blocks_than_the_cap_is_an_anthropic_400(
    client: TestClient, path: str, count: int
) -> None:
    sent = json.loads(messages_body(count, 2))
    sent["messages"][-1]["content"] = [{"type": "text", "text": "w"}] * (MAX_CONTENT_BLOCKS + 1)
    if count > 1:
        sent["messages"][0]["content"] = [{"type": "text", "text": "w" * 5000}] * 40
    refusal_of_blocks(client, path, sent, large=count > 1)
    # At the cap, the turn is taken.
    sent["messages"][-1]["content"] = [{"type": "text", "text": "w"}] * MAX_CONTENT_BLOCKS
    assert client.post(path, headers=JSON, content=json.dumps(sent).encode()).status_code == 200


@pytest.mark.parametrize("path", [MESSAGES, COUNT])
@pytest.mark.parametrize("count", [1, 41])
def test_a_system_prompt_of_more_blocks_than_the_cap_is_an_anthropic_400(
    client: TestClient, path: str, count: int
) -> None:
    sent = json.loads(messages_body(count, 2 if count == 1 else 200))
    sent["system"] = [{"type": "text", "text": "s"}] * (MAX_CONTENT_BLOCKS + 1)
    assert "system prompt" in refusal_of_blocks(client, path, sent, large=count > 1)
    sent["system"] = [{"type": "text", "text": "s"}] * MAX_CONTENT_BLOCKS
    assert client.post(path, headers=JSON, content=json.dumps(sent).encode()).status_code == 200


@pytest.mark.parametrize("model", [MessagesRequest, CountTokensRequest])
def test_what_the_worker_sends_back_holds_no_blocks_system_prompt_or_tools(
    model: type[MessagesRequest] | type[CountTokensRequest],
) -> None:
    tool = {"name": "lookup", "input_schema": {"type": "object", "properties": {}}}
    sent = json.loads(messages_body(41, 200))
    sent["system"] = [{"type": "text", "text": "be brief " * 500}] * MAX_CONTENT_BLOCKS
    sent["tools"] = [tool | {"name": f"tool_{i}", "description": "d" * 1000} for i in range(64)]
    back = compact_body(model, json.dumps(sent).encode(), convert=True).request
    assert isinstance(back, model)
    assert back.messages == [] and back.system is None and back.tools is None
    chat = back.chat_body()  # the conversion, done before they were let go
    assert chat["messages"][0]["role"] == "system" and "be brief" in chat["messages"][0]["content"]
    assert len(chat["tools"]) == 64
    assert len(pickle.dumps(back)) < len(json.dumps(chat)) * 2


def test_health_keeps_answering_while_a_huge_messages_body_is_worked_on(
    engine: FakeEngine,
) -> None:
    # About the most blocks a body may hold: 555,000 empty ones.
    body = messages_body(555, 1000, text="")
    assert BODY_LIMIT * 0.9 < len(body) <= BODY_LIMIT
    with serve_in_thread(fake_app(engine, max_request_bytes=BODY_LIMIT)) as url:
        # The worker process started, so its start is not counted as the body's.
        warm = httpx.post(f"{url}{MESSAGES}", headers=JSON, content=messages_body(41, 200))
        assert warm.status_code == 200, warm.text
        with health_silence(url) as found:
            answer = httpx.post(f"{url}{MESSAGES}", headers=JSON, content=body, timeout=120)
    assert answer.status_code == 200, answer.text
    assert found and found[0] <= STALL_BOUND_S, (
        f"/health went {found[0]:.2f} s without an answer while a huge Messages body was "
        "worked on: the event loop stalled"
    )

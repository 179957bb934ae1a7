"""Keep-alives on every API's stream (`Exchange.stream_events`), over a fake engine on loopback:
an SSE comment on chat, completions and Responses, Anthropic's `ping` on Messages, when the
engine is silent mid-stream or before its first token (an OpenAI stream then begins with the
comment), while thoughts left out are progress that shows nothing; an error before the
interval keeps its status. The openai and anthropic SDKs read a pinged stream whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from sluicegate.errors import OverloadedError
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

COMMENT, PING = ": keep-alive\n\n", 'event: ping\ndata: {"type":"ping"}\n\n'
INTERVAL = 0.1
SILENCE = 0.45
"""Seconds the engine says nothing: about four intervals."""
MESSAGES = {"model": FAKE_MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}
APIS = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}, COMMENT),
    "completions": ("/v1/completions", {"prompt": "Hi"}, COMMENT),
    "responses": ("/v1/responses", {"input": "Hi"}, COMMENT),
    "messages": ("/v1/messages", MESSAGES, PING),
}
ENDS = {
    "chat": "data: [DONE]\n\n",
    "completions": "data: [DONE]\n\n",
    "responses": '"type":"response.completed"',
    "messages": "event: message_stop",
}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=["Hello", " there", "!"])


@pytest.fixture
def url(engine: FakeEngine) -> Iterator[str]:
    app = fake_app(engine, stream_keepalive_interval=INTERVAL, stream_stall_timeout=5.0)
    with serve_in_thread(app) as base:
        yield base


def stream(url: str, api: str) -> str:
    path, body, _ = APIS[api]
    answer = httpx.post(
        f"{url}{path}", json={"model": FAKE_MODEL, **body, "stream": True}, timeout=30
    )
    assert answer.status_code == 200, answer.text
    return answer.text


def text_of(api: str, body: str) -> str:
    """The answer's text, from the stream's events."""
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: {")]
    if api == "chat":
        return "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    if api == "completions":
        return "".join(e["choices"][0]["text"] for e in events if e["choices"])
    if api == "responses":
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")


@pytest.mark.parametrize("api", list(APIS))
def test_an_engine_silent_mid_stream_gets_pings_between_the_tokens(
    api: str, url: str, engine: FakeEngine
) -> None:
    engine.delays = [0.0, SILENCE, 0.0]
    body = stream(url, api)
    ping = APIS[api][2]
    # Between the first word and the second: 4 or so pings, never one after the other comes.
    head, tail = body.split("Hello", 1)
    assert ping not in head and ping not in tail.split("there", 1)[1], body
    assert 2 <= tail.split("there", 1)[0].count(ping) <= 5, body
    assert text_of(api, body) == "Hello there!" and ENDS[api] in body


@pytest.mark.parametrize("api", list(APIS))
def test_a_slow_first_token_begins_the_stream_then_pings(
    api: str, url: str, engine: FakeEngine
) -> None:
    engine.delays = [SILENCE]
    body = stream(url, api)
    ping = APIS[api][2]
    before = body.split("Hello", 1)[0]
    if api == "messages":  # Anthropic's opens with its own event (`STREAM_PING_AFTER`)
        assert (
            before.startswith("event: message_start") and before.count("event: message_start") == 1
        )
        before = before.split("\n\n", 1)[1]
    assert before.startswith(ping) and 2 <= before.count(ping) <= 5, body
    assert text_of(api, body) == "Hello there!" and ENDS[api] in body


def test_thoughts_left_out_are_progress_and_the_stream_pings_through_them() -> None:
    # 0.8 s of thoughts not shown, one each 0.1 s under a 0.5 s stall bound: the stream goes
    # on (the engine is working), and it pings, since nothing shows.
    engine = FakeEngine(words=["Hello", " there", "!"], reasoning_words=["."] * 8, step_delay=0.1)
    app = fake_app(engine, stream_keepalive_interval=0.15, stream_stall_timeout=0.5)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "include_reasoning": False}
    with serve_in_thread(app) as url:
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={"model": FAKE_MODEL, **chat, "stream": True},
            timeout=30,
        )
    assert answer.status_code == 200 and '"error"' not in answer.text, answer.text
    assert answer.text.count(COMMENT) >= 2 and "reasoning" not in answer.text
    assert text_of("chat", answer.text) == "Hello there!"


def test_an_error_before_the_interval_keeps_its_status(engine: FakeEngine) -> None:
    engine.fail_before_output = OverloadedError()
    app = fake_app(engine, stream_keepalive_interval=5.0)
    with serve_in_thread(app) as url:
        answer = httpx.post(
            f"{url}/v1/chat/completions",
            json={**APIS["chat"][1], "model": FAKE_MODEL, "stream": True},
            timeout=30,
        )
    assert answer.status_code == OverloadedError.status_code
    assert answer.json()["error"]["code"] == "overloaded"


def recording(lib: Any) -> tuple[Any, bytearray]:
    """A `lib.Client` (httpx; httpx2 for the anthropic SDK, which has its own) that keeps a
    copy of every response's bytes, as the SDK was given them; the copy."""
    seen = bytearray()
    base = lib.HTTPTransport()

    class Copied(lib.SyncByteStream):  # type: ignore[misc]
        def __init__(self, stream: Any) -> None:
            self.stream = stream

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.stream:
                seen.extend(chunk)
                yield chunk

        def close(self) -> None:
            self.stream.close()

    class Transport(lib.BaseTransport):  # type: ignore[misc]
        def handle_request(self, request: Any) -> Any:
            response = base.handle_request(request)
            response.stream = Copied(response.stream)
            return response

        def close(self) -> None:
            base.close()

    return lib.Client(transport=Transport()), seen


def test_the_openai_sdk_reads_pinged_chat_and_responses_streams_whole(
    url: str, engine: FakeEngine
) -> None:
    engine.delays = [SILENCE, SILENCE, 0.0]  # before the first token, and after it
    client, seen = recording(httpx)
    with openai.OpenAI(
        base_url=f"{url}/v1", api_key="none", max_retries=0, http_client=client
    ) as sdk:
        chunks = list(
            sdk.chat.completions.create(
                model=FAKE_MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
            )
        )
        with sdk.responses.stream(model=FAKE_MODEL, input="Hi") as events:
            types = [e.type for e in events]
            final = events.get_final_response()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello there!"
    )
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert types[0] == "response.created" and types[-1] == "response.completed"
    assert final.output_text == "Hello there!"
    assert seen.count(COMMENT.encode()) >= 4  # two streams, pinged twice at least each


def test_the_anthropic_sdk_reads_a_pinged_messages_stream_whole(
    url: str, engine: FakeEngine
) -> None:
    engine.delays = [SILENCE, SILENCE, 0.0]
    client, seen = recording(httpx2)
    with (
        anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, http_client=client) as sdk,
        sdk.messages.stream(**MESSAGES) as events,
    ):
        kinds = [e.type for e in events]
        final = events.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [block.type for block in final.content] == ["text"]
    assert final.content[0].text == "Hello there!" and final.stop_reason == "end_turn"
    assert seen.count(PING.encode()) >= 4

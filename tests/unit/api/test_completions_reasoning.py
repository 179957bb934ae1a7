"""Reasoning through `/v1/chat/completions` over a fake engine that splits its thoughts (as an
upstream does), on loopback: answers, streams, the response cache and its replays carry the
same thoughts and count; `include_reasoning: false` leaves them out; the request's reasoning
fields reach the engine, and an assistant turn's thoughts reach the template."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from sluicegate.engine.protocol import ReasoningOptions
from tests.support.fakes import FakeEngine, fake_app, greedy_chat, serve_in_thread
from tests.support.sse import sse_payloads

THOUGHTS = ["The user", " greets.", " Greet back."]
WORDS = ["Hello", " there", "!"]


@pytest.fixture
def served() -> Iterator[tuple[str, FakeEngine]]:
    engine = FakeEngine(words=list(WORDS), reasoning_words=list(THOUGHTS), renders_chat=True)
    with serve_in_thread(fake_app(engine, cache_policy="deterministic")) as url:
        yield url, engine


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer


def _streamed(url: str, body: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None, str]:
    answer = _post(url, {**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [e for e in sse_payloads(answer.text) if e != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    reasoning = "".join(d.get("reasoning", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    return reasoning, content, chunks[-1]["usage"], answer.headers.get("x-cache", "")


def test_the_answer_carries_the_thoughts_and_counts_them(
    served: tuple[str, FakeEngine],
) -> None:
    url, _ = served
    first = _post(url, greedy_chat())
    again = _post(url, greedy_chat())
    assert (first.headers["x-cache"], again.headers["x-cache"]) == ("MISS", "HIT")
    for answer in (first, again):
        body = answer.json()
        assert body["choices"][0]["message"]["reasoning"] == "".join(THOUGHTS)
        assert body["choices"][0]["message"]["content"] == "".join(WORDS)
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}
        assert body["usage"]["completion_tokens"] == len(THOUGHTS) + len(WORDS)


def test_a_stream_and_its_replay_from_the_cache_carry_the_same_thoughts(
    served: tuple[str, FakeEngine],
) -> None:
    url, _ = served
    body = greedy_chat("Stream it")
    live, replayed = _streamed(url, body), _streamed(url, body)
    assert (live[3], replayed[3]) == ("MISS", "HIT")
    assert live[:3] == replayed[:3]
    assert live[:2] == ("".join(THOUGHTS), "".join(WORDS))
    assert live[2] is not None
    assert live[2]["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}


def test_include_reasoning_false_leaves_the_thoughts_out_of_answers_and_streams(
    served: tuple[str, FakeEngine],
) -> None:
    url, _ = served
    _post(url, greedy_chat("Hidden"))  # the same request with thoughts, cached first
    hidden = _post(url, greedy_chat("Hidden", include_reasoning=False))
    assert hidden.headers["x-cache"] == "MISS", "an answer with thoughts was served without"
    message = hidden.json()["choices"][0]["message"]
    assert "reasoning" not in message and message["content"] == "".join(WORDS)
    reasoning, content, usage, _ = _streamed(url, greedy_chat("Hidden", include_reasoning=False))
    assert (reasoning, content) == ("", "".join(WORDS))
    assert usage is not None
    assert usage["completion_tokens_details"] == {"reasoning_tokens": len(THOUGHTS)}


def test_the_reasoning_fields_reach_the_engine_and_history_reaches_the_template(
    served: tuple[str, FakeEngine],
) -> None:
    url, engine = served
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", "reasoning_content": "Greet back."},
        {"role": "user", "content": "Again"},
    ]
    body = {
        **greedy_chat(),
        "messages": turns,
        "reasoning_effort": "low",
        "chat_template_kwargs": {"custom": 1},
        "thinking_token_budget": 9,
    }
    _post(url, body)
    options = engine.requests[-1][2].reasoning
    assert options == ReasoningOptions(
        effort="low",
        template_kwargs='{"custom": 1}',
        budget=9,
    )
    assert options.kwargs() == {"custom": 1, "enable_thinking": True, "reasoning_effort": "low"}
    chat = engine.prompts[-1].chat
    assert chat is not None
    # Under the name the client sent it with (an upstream gets that one; templates both).
    assert chat.messages[1]["reasoning_content"] == "Greet back."
    assert "reasoning" not in chat.messages[1]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": "on"}, "chat_template_kwargs"),
        ({"thinking_token_budget": -5}, "thinking_token_budget"),
        ({"include_reasoning": "maybe"}, "include_reasoning"),
    ],
)
def test_bad_reasoning_fields_are_400s_naming_them(
    served: tuple[str, FakeEngine], extra: dict[str, Any], param: str
) -> None:
    url, _ = served
    answer = httpx.post(f"{url}/v1/chat/completions", json=greedy_chat(**extra), timeout=10)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", greedy_chat("Quiet", include_reasoning=False, stream=True)),
        (
            "/v1/messages",
            {
                "model": "fake-model",
                "max_tokens": 16,
                "stream": True,
                "messages": [{"role": "user", "content": "Quiet"}],
            },
        ),
    ],
)
def test_thoughts_not_shown_are_no_stall(path: str, body: dict[str, Any]) -> None:
    # 0.8 s of thoughts the stream does not show (left out, or an API that shows none yet),
    # each step within the 0.5 s stall bound: the engine is working, the stream goes on.
    engine = FakeEngine(words=list(WORDS), reasoning_words=["."] * 8, step_delay=0.1)
    app = fake_app(engine, stream_stall_timeout=0.5, stream_ping_after=30)
    with serve_in_thread(app) as url:
        answer = httpx.post(f"{url}{path}", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    assert '"error"' not in answer.text, answer.text
    assert "Hello" in answer.text and "there" in answer.text

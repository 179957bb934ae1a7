"""A reasoning model's answers through the response cache, over the fake engine (its
`reasoning_words` come first as `reasoning` deltas, as an upstream's split thoughts do), with
the in-memory store and with a real Redis (its near cache and rendered bodies): every hit,
JSON or replayed stream, by the full path or the fast path, carries the live answer's
thoughts and their count."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.fakes import (
    FakeEngine,
    greedy_chat,
    post,
)
from tests.support.sse import sse_payloads

THOUGHTS = ["Two", " and", " two."]
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(words=["Four", "."], reasoning_words=THOUGHTS, max_model_len=256)


def _streamed(text: str) -> tuple[list[str], str, dict[str, Any]]:
    """A stream's chunks of thought (as sent), its content joined, and its usage."""
    thoughts: list[str] = []
    content: list[str] = []
    usage: dict[str, Any] = {}
    for event in sse_payloads(text):
        if not isinstance(event, dict):
            continue
        usage = event.get("usage") or usage
        for choice in event["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning"):
                assert not "".join(content), "a thought after the content"
                thoughts.append(delta["reasoning"])
            content.append(delta.get("content") or "")
    return thoughts, "".join(content), usage


async def test_a_hit_answers_with_the_live_thoughts_and_their_count(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    live = await post(http, greedy_chat())
    hits = [await post(http, greedy_chat()) for _ in range(3)]  # full path, then fast path
    message = live.json()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Two and two.", "Four.")
    usage = live.json()["usage"]
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}
    for hit in hits:
        assert hit.headers["x-cache"] == "HIT"
        assert hit.json()["choices"] == live.json()["choices"]
        assert hit.json()["usage"] == usage
    assert len(engine.requests) == 1


async def test_a_replayed_stream_sends_the_thoughts_as_the_live_stream_did(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    live = await post(http, greedy_chat(**STREAM))
    replays = [await post(http, greedy_chat(**STREAM)) for _ in range(2)]
    thoughts, content, usage = _streamed(live.text)
    assert (thoughts, content) == (THOUGHTS, "Four.")
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}
    for replay in replays:
        assert replay.headers["x-cache"] == "HIT"
        assert _streamed(replay.text) == (thoughts, content, usage)
    # A JSON request hits the entry the stream left: the same thoughts, joined.
    whole = await post(http, greedy_chat())
    assert whole.headers["x-cache"] == "HIT"
    assert whole.json()["choices"][0]["message"]["reasoning"] == "Two and two."
    assert whole.json()["usage"] == usage
    assert len(engine.requests) == 1


async def test_an_answer_without_thoughts_is_keyed_apart(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    shown = await post(http, greedy_chat())
    hidden = await post(http, greedy_chat(include_reasoning=False))
    assert hidden.headers["x-cache"] == "MISS"
    assert hidden.json()["choices"][0]["message"].get("reasoning") is None
    again = await post(http, greedy_chat(include_reasoning=False))
    assert again.headers["x-cache"] == "HIT"
    assert again.json()["choices"][0]["message"].get("reasoning") is None
    assert shown.json()["choices"][0]["message"]["reasoning"] == "Two and two."
    assert len(engine.requests) == 2

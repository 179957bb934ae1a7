"""Chat answers of a reasoning model, split by the gateway, against vLLM's own server splitting
them with the same parser (`step3`) on the same model and template: greedy, so the thoughts,
the answer and the count of reasoning tokens must be the same, streamed and not."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.integration.reasoning.conftest import SERVED, Pair

pytestmark = pytest.mark.timeout(900)

QUESTION = [{"role": "user", "content": "Tell me about Paris."}]
GREEDY = {"model": SERVED, "temperature": 0, "max_tokens": 48, "messages": QUESTION}


@dataclass(frozen=True)
class Answer:
    reasoning: str | None
    content: str | None
    reasoning_tokens: int | None
    usage: dict[str, Any]


def ask(base: str, body: dict[str, Any], stream: bool) -> Answer:
    """One chat answer: a whole message, or the stream's deltas joined."""
    body = {**body, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = httpx.post(
        f"{base}/chat/completions",
        json=body,
        headers={"cache-control": "no-cache"},
        timeout=120,
    )
    assert response.status_code == 200, response.text
    if not stream:
        data = response.json()
        message = data["choices"][0]["message"]
        return Answer(
            message.get("reasoning"),
            message.get("content"),
            _reasoning_tokens(data["usage"]),
            data["usage"],
        )
    thoughts: list[str] = []
    answer: list[str] = []
    usage: dict[str, Any] = {}
    for line in response.text.splitlines():
        if not line.startswith("data: {"):
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            delta = choice["delta"]
            thoughts.append(delta.get("reasoning") or "")
            answer.append(delta.get("content") or "")
        if chunk.get("usage"):
            usage = chunk["usage"]
    return Answer(
        "".join(thoughts) or None, "".join(answer) or None, _reasoning_tokens(usage), usage
    )


def _reasoning_tokens(usage: dict[str, Any]) -> int | None:
    details = usage.get("completion_tokens_details") or {}
    tokens = details.get("reasoning_tokens")
    return None if tokens is None else int(tokens)


def both(pair: Pair, body: dict[str, Any], stream: bool) -> tuple[Answer, Answer]:
    return ask(pair.vllm, body, stream), ask(pair.gateway.url + "/v1", body, stream)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_thoughts_answer_and_count_are_vllms(pair: Pair, stream: bool) -> None:
    theirs, ours = both(pair, GREEDY, stream)
    # The model thinks, ends its thoughts, then answers: the case is not trivial.
    assert theirs.reasoning and theirs.content, theirs
    assert 0 < (theirs.reasoning_tokens or 0) < theirs.usage["completion_tokens"]
    assert ours.reasoning == theirs.reasoning
    assert ours.content == theirs.content
    assert ours.reasoning_tokens == theirs.reasoning_tokens
    assert ours.usage["completion_tokens"] == theirs.usage["completion_tokens"]
    assert ours.usage["prompt_tokens"] == theirs.usage["prompt_tokens"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_hidden_thoughts_are_vllms(pair: Pair, stream: bool) -> None:
    """`include_reasoning: false`: the answer alone, the thoughts still counted."""
    theirs, ours = both(pair, {**GREEDY, "include_reasoning": False}, stream)
    assert theirs.reasoning is None and theirs.content
    assert ours.reasoning is None
    assert ours.content == theirs.content
    assert ours.reasoning_tokens == theirs.reasoning_tokens


def test_no_thinking_is_vllms_streamed(pair: Pair) -> None:
    """`reasoning_effort: "none"`: the template closes the thoughts in the prompt, so all that
    comes is answer (vLLM's server, streaming, reads the prompt as the gateway does)."""
    body = {**GREEDY, "reasoning_effort": "none"}
    theirs, ours = both(pair, body, stream=True)
    assert theirs.reasoning is None and theirs.content
    assert (ours.reasoning, ours.content) == (theirs.reasoning, theirs.content)
    assert ours.reasoning_tokens == theirs.reasoning_tokens
    assert ours.usage["prompt_tokens"] == theirs.usage["prompt_tokens"]
    # Unstreamed, the gateway answers as streamed (its answers are the stream's deltas).
    whole = ask(pair.gateway.url + "/v1", body, stream=False)
    assert (whole.reasoning, whole.content) == (ours.reasoning, ours.content)
    assert whole.reasoning_tokens == theirs.reasoning_tokens
    # vLLM's server, unstreamed, parses the text without the prompt: as if it were thoughts,
    # up to its first `</think>` (docs/models.md says so); if it ever reads the prompt, it
    # answers as we do.
    theirs_whole = ask(pair.vllm, body, stream=False)
    text = ours.content or ""
    before, marker, after = text.partition("</think>")
    as_thoughts = (before, after or None) if marker else (text, None)
    assert (theirs_whole.reasoning, theirs_whole.content) in (as_thoughts, (None, ours.content))


def test_history_thoughts_are_counted_as_vllm_counts_them(pair: Pair) -> None:
    messages = [
        *QUESTION,
        {"role": "assistant", "content": "It is in France.", "reasoning": "Paris is a city."},
        {"role": "user", "content": "And about Rome?"},
    ]
    body = {**GREEDY, "messages": messages, "max_tokens": 8}
    theirs, ours = both(pair, body, stream=False)
    bare = ask(pair.vllm, {**body, "messages": [{**m, "reasoning": None} for m in messages]}, False)
    assert theirs.usage["prompt_tokens"] > bare.usage["prompt_tokens"]  # the thought is in
    assert ours.usage["prompt_tokens"] == theirs.usage["prompt_tokens"]
    assert (ours.reasoning, ours.content) == (theirs.reasoning, theirs.content)


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_structured_answer_after_free_thoughts_is_vllms(pair: Pair, stream: bool) -> None:
    """The schema constrains the answer only: the thoughts come first, free."""
    body = {
        **GREEDY,
        "max_tokens": 64,
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}},
    }
    theirs, ours = both(pair, body, stream)
    assert theirs.reasoning, theirs
    assert (ours.reasoning, ours.content) == (theirs.reasoning, theirs.content)
    assert ours.reasoning_tokens == theirs.reasoning_tokens
    if ours.usage["completion_tokens"] < body["max_tokens"]:
        assert isinstance(json.loads(ours.content or ""), dict)


def test_a_thinking_budget_cuts_as_vllms(pair: Pair) -> None:
    """`thinking_token_budget`: vLLM's engine ends the thoughts once the budget is spent
    (here, through the engine core the gateway tells of its parser)."""
    body = {**GREEDY, "thinking_token_budget": 3}
    theirs, ours = both(pair, body, stream=False)
    free = ask(pair.vllm, GREEDY, stream=False)
    assert (theirs.reasoning_tokens or 0) < (free.reasoning_tokens or 0)  # it did cut
    assert (ours.reasoning, ours.content) == (theirs.reasoning, theirs.content)
    assert ours.reasoning_tokens == theirs.reasoning_tokens

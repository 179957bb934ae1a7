"""The gateway's split of a run's output into thoughts and answer, with a fake parser (the real
one over vLLM's parsers: tests/unit/engine/test_reasoning_parser.py): one stream per choice,
fed in order, counted at the end; chats only; and through HTTP, over the fake engine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from sluicegate.engine.protocol import ChoiceDelta, Prompt
from sluicegate.inference.reasoning import ReasoningSplit, chat_shaped
from sluicegate.wire.formats import chat_format, completion_format
from tests.support.fakes import FAKE_MODEL, FakeEngine, fake_app, serve_in_thread

MARK = "|"


@dataclass
class FakeStream:
    """Text before a piece `|` is thought, after it answer; counts the pieces before it."""

    prompt_ids: list[int]
    kwargs: dict[str, Any]
    fed: list[tuple[str, list[int], bool]] = field(default_factory=list)
    ended: bool = False
    thoughts: int = 0

    def feed(self, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str, str]:
        self.fed.append((text, list(token_ids), finished))
        if text.strip() == MARK:
            self.ended = True
            return "", ""
        if self.ended:
            return "", text
        self.thoughts += 1
        return text, ""

    def count(self) -> int:
        return self.thoughts


@dataclass
class FakeParser:
    name: str = "fake"
    streams: list[FakeStream] = field(default_factory=list)

    def stream(self, prompt_ids: Sequence[int], template_kwargs: Mapping[str, Any]) -> FakeStream:
        made = FakeStream(list(prompt_ids), dict(template_kwargs))
        self.streams.append(made)
        return made


def delta(index: int, text: str, ids: list[int], finish: bool = False) -> ChoiceDelta:
    return ChoiceDelta(index, text, len(ids), "stop" if finish else None, token_ids=ids)


def test_each_choice_has_a_stream_of_its_own_prompt() -> None:
    parser = FakeParser()
    prompts = [Prompt([1, 2]), Prompt([3])]
    split = ReasoningSplit(parser, prompts, n=2, template_kwargs={"enable_thinking": True})
    deltas = [
        delta(0, "Hmm", [7]),
        delta(3, "Well", [8]),
        delta(0, MARK, [9]),
        delta(3, " so", [10]),
        delta(0, "Paris", [11], finish=True),
        delta(3, MARK, [9]),
        delta(3, "Rome", [12], finish=True),
    ]
    for d in deltas:
        split.split(d)
    # Choice 0 is prompt 0's, choice 3 prompt 1's (two choices a prompt).
    assert [s.prompt_ids for s in parser.streams] == [[1, 2], [3]]
    assert all(s.kwargs == {"enable_thinking": True} for s in parser.streams)
    assert [(d.index, d.reasoning, d.text) for d in deltas] == [
        (0, "Hmm", ""),
        (3, "Well", ""),
        (0, "", ""),
        (3, " so", ""),
        (0, "", "Paris"),
        (3, "", ""),
        (3, "", "Rome"),
    ]
    # Counted on the finishing delta only; ids read, then dropped (nothing stores them).
    assert [d.reasoning_tokens for d in deltas] == [0, 0, 0, 0, 1, 0, 2]
    assert all(d.token_ids is None for d in deltas)
    assert parser.streams[0].fed == [("Hmm", [7], False), (MARK, [9], False), ("Paris", [11], True)]


def test_only_chat_shaped_runs_are_split() -> None:
    chat = chat_format("m", False)
    assert chat_shaped(chat)
    # Responses and Messages formats wrap the chat format as `chat`.
    assert chat_shaped(SimpleNamespace(chat=SimpleNamespace(chat=chat)))  # type: ignore[arg-type]
    assert not chat_shaped(completion_format("m", False))


@pytest.fixture
def engine() -> FakeEngine:
    engine = FakeEngine(words=["Hmm", " |", " Paris"], max_model_len=256)
    engine.reasoning_parser = FakeParser()
    return engine


@pytest.fixture
async def http(engine: FakeEngine) -> AsyncIterator[httpx.AsyncClient]:
    with serve_in_thread(fake_app(engine)) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            yield client


def chat(**extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": "capital of France"}]
    return {"model": FAKE_MODEL, "messages": messages, "max_tokens": 3, **extra}


async def test_a_chat_answer_carries_the_thoughts_apart(http: httpx.AsyncClient) -> None:
    body = (await http.post("/v1/chat/completions", json=chat())).json()
    message = body["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == ("Hmm", " Paris")
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}


async def test_a_streamed_chat_and_its_cache_hit_split_alike(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    body = chat(stream=True, stream_options={"include_usage": True}, temperature=0)
    live = await http.post("/v1/chat/completions", json=body)
    hit = await http.post("/v1/chat/completions", json=body)
    assert hit.headers["x-cache"] == "HIT"
    assert len(engine.requests) == 1
    for response in (live, hit):
        chunks = [
            json.loads(line[6:])
            for line in response.text.splitlines()
            if line.startswith("data: {")
        ]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("reasoning") or "" for d in deltas) == "Hmm"
        assert "".join(d.get("content") or "" for d in deltas) == " Paris"
        assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 1}


async def test_the_template_arguments_reach_each_stream(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    await http.post("/v1/chat/completions", json=chat(reasoning_effort="low", n=2))
    parser = engine.reasoning_parser
    assert isinstance(parser, FakeParser)
    assert len(parser.streams) == 2
    expected = {"reasoning_effort": "low", "enable_thinking": True}
    assert all(s.kwargs == expected for s in parser.streams)


async def test_completions_are_not_split(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {"model": FAKE_MODEL, "prompt": "capital of France", "max_tokens": 3}
    response = (await http.post("/v1/completions", json=body)).json()
    assert response["choices"][0]["text"] == "Hmm | Paris"
    parser = engine.reasoning_parser
    assert isinstance(parser, FakeParser) and parser.streams == []


async def test_the_budget_renders_the_prompt_with_the_requests_template_arguments(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    await http.post("/v1/chat/completions", json=chat(reasoning_effort="none"))
    assert engine.tokenizer.template_kwargs[-1] == {
        "reasoning_effort": "none",
        "enable_thinking": False,
    }
    await http.post("/v1/chat/completions", json=chat())
    assert engine.tokenizer.template_kwargs[-1] is None

"""Reasoning on the upstream wire: the request's reasoning fields sent as vLLM's server takes
them, an assistant turn's thoughts under both names, and the answer's thoughts read under
either name, streamed or whole, with the usage's reasoning tokens on the finishing delta."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from sluicegate.engine.protocol import ChatPrompt, EngineStep, Prompt, SamplingOptions
from sluicegate.engine.upstream.stream import events
from sluicegate.engine.upstream.tokenizer import RemoteTokenizer
from sluicegate.engine.upstream.wire import StreamReader, request_body, wire_message
from sluicegate.wire.requests import reasoning_options

USER = {"role": "user", "content": "hi"}


def _body(options: SamplingOptions, *messages: dict[str, Any]) -> dict[str, Any]:
    chat = ChatPrompt(list(messages) or [USER])
    return request_body("m", Prompt([], chat=chat), options)[1]


def test_the_reasoning_fields_go_as_vllms_server_takes_them() -> None:
    reasoning = reasoning_options("low", {"custom": [1, 2]}, include=False, budget=32)
    body = _body(SamplingOptions(max_tokens=8, reasoning=reasoning))
    assert body["reasoning_effort"] == "low"
    # The kwargs as the client sent them: the upstream merges the effort in itself.
    assert body["chat_template_kwargs"] == {"custom": [1, 2]}
    assert body["include_reasoning"] is False
    assert body["thinking_token_budget"] == 32


def test_reasoning_fields_left_at_their_default_are_not_sent() -> None:
    plain = _body(SamplingOptions(max_tokens=8))
    kwargs_only = _body(
        SamplingOptions(max_tokens=8, reasoning=reasoning_options(None, {"enable_thinking": False}))
    )
    for body in (plain, kwargs_only):
        assert "reasoning_effort" not in body and "include_reasoning" not in body
        assert "thinking_token_budget" not in body
    assert "chat_template_kwargs" not in plain
    assert kwargs_only["chat_template_kwargs"] == {"enable_thinking": False}


def test_an_effort_alone_sends_no_template_kwargs() -> None:
    # OpenAI's API refuses fields it does not know: none is added to what the client sent.
    body = _body(SamplingOptions(max_tokens=8, reasoning=reasoning_options("high", None)))
    assert body["reasoning_effort"] == "high" and "chat_template_kwargs" not in body


def test_a_completion_sends_no_reasoning_fields() -> None:
    options = SamplingOptions(max_tokens=4, reasoning=reasoning_options("high", None))
    path, body = request_body("m", Prompt([1], text="The sky"), options)
    assert path == "/completions" and "reasoning_effort" not in body


@pytest.mark.parametrize("name", ["reasoning", "reasoning_content"])
def test_an_assistants_thoughts_go_under_the_name_they_came_with(name: str) -> None:
    # DeepSeek's API refuses `reasoning_content` in input, OpenAI's fields it does not know.
    turn = {"role": "assistant", "content": "4", name: "2 and 2"}
    body = _body(SamplingOptions(max_tokens=8), USER, turn, USER)
    sent = body["messages"][1]
    assert sent[name] == "2 and 2"
    assert {"reasoning", "reasoning_content"} & set(sent) == {name}
    assert "reasoning" not in body["messages"][0] and "reasoning_content" not in body["messages"][0]
    assert wire_message(USER) == USER


def _chunk(index: int = 0, finish: str | None = None, **delta: object) -> str:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return json.dumps({"choices": [choice]}, separators=(",", ":"))


def _usage(prompt: int, completion: int, thought: int | None) -> str:
    usage: dict[str, Any] = {"prompt_tokens": prompt, "completion_tokens": completion}
    if thought is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": thought}
    return json.dumps({"choices": [], "usage": usage})


@pytest.mark.parametrize("name", ["reasoning", "reasoning_content"])
def test_streamed_thoughts_are_read_under_either_name_and_counted(name: str) -> None:
    reader = StreamReader(choices=1)
    steps = [reader.feed(_chunk(role="assistant", content=""))]
    steps += [reader.feed(_chunk(**{name: piece})) for piece in ("Two ", "and two.")]
    steps += [reader.feed(_chunk(content="4")), reader.feed(_chunk(finish="stop"))]
    assert reader.feed(_usage(5, 6, 4)) is None
    last = reader.finish()
    deltas = [d for s in steps if s is not None for d in s.choices]
    assert [(d.reasoning, d.text) for d in deltas] == [("Two ", ""), ("and two.", ""), ("", "4")]
    # A chunk of thoughts is a token, as one of text; the usage settles both counts.
    assert [d.num_tokens for d in deltas] == [1, 1, 1]
    (end,) = last.choices
    assert end.finish_reason == "stop" and end.num_tokens == 6 - 3
    assert end.reasoning_tokens == 4


def test_vllms_reasoning_wins_over_reasoning_content_when_a_server_writes_both() -> None:
    reader = StreamReader(choices=1)
    step = reader.feed(_chunk(reasoning="new", reasoning_content="old"))
    assert step is not None and step.choices[0].reasoning == "new"


def test_a_usage_without_details_or_with_impossible_ones_counts_no_thoughts() -> None:
    for usage in (_usage(1, 3, None), _usage(1, 3, 9), _usage(1, 3, -1)):
        reader = StreamReader(choices=1)
        reader.feed(_chunk(reasoning="hm"))
        reader.feed(_chunk(content="ok", finish="stop"))
        reader.feed(usage)
        (end,) = reader.finish().choices
        assert end.reasoning_tokens == 0 and end.num_tokens == 3 - 1


def test_several_choices_share_the_reasoning_tokens_by_their_chunks_of_thought() -> None:
    reader = StreamReader(choices=3)
    for index, thoughts in ((0, 1), (1, 3), (2, 0)):
        for _ in range(thoughts):
            reader.feed(_chunk(index, reasoning="x"))
        reader.feed(_chunk(index, content="y", finish="stop"))
    reader.feed(_usage(2, 12, 9))
    ends = sorted(reader.finish().choices, key=lambda d: d.index)
    # 9 shared 1:3:0 is 2.25, 6.75, 0: floors 2 and 6, the remainder on the first.
    assert [d.reasoning_tokens for d in ends] == [3, 6, 0]
    assert sum(d.reasoning_tokens for d in ends) == 9


def test_several_choices_without_chunks_of_thought_put_the_count_on_the_first() -> None:
    reader = StreamReader(choices=2)
    reader.feed(_chunk(1, content="b", finish="stop"))
    reader.feed(_chunk(0, content="a", finish="stop"))
    reader.feed(_usage(2, 4, 2))
    counts = {d.index: d.reasoning_tokens for d in reader.finish().choices}
    assert counts == {0: 2, 1: 0}


def test_thoughts_and_text_of_one_read_join_into_one_delta() -> None:
    reader = StreamReader(choices=1)
    lines = ["data: " + _chunk(reasoning="a"), "", "data: " + _chunk(reasoning="b")]
    lines += ["", "data: " + _chunk(content="c")]
    step = reader.feed_lines(lines)
    assert step is not None
    (delta,) = step.choices
    assert (delta.reasoning, delta.text, delta.num_tokens) == ("ab", "c", 3)


def test_passed_through_chunks_of_thought_go_as_they_came_and_count() -> None:
    reader = StreamReader(choices=1, raw=True)
    chunks = [
        _chunk(role="assistant", content=""),
        _chunk(reasoning="Two"),
        # llama.cpp writes a null content beside its thoughts.
        _chunk(content=None, reasoning_content=" and two"),
        _chunk(content="4"),
    ]
    step = reader.feed_lines(["data: " + c for c in chunks])
    assert step is not None
    (delta,) = step.choices
    assert delta.raw == "".join(f"data: {c}\n\n" for c in chunks)  # bytes as they came
    assert delta.num_tokens == 3  # the role chunk is no token
    reader.feed_lines(["data: " + _chunk(finish="stop"), "data: " + _usage(4, 5, 2)])
    (end,) = reader.finish().choices
    assert end.num_tokens == 5 - 3 and end.reasoning_tokens == 2


def test_a_whole_answers_message_gives_its_thoughts_text_and_counts() -> None:
    answer = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 7,
            "completion_tokens_details": {"reasoning_tokens": 5},
        },
    }
    reader = StreamReader(choices=1, raw=True)
    assert reader.feed_answer(json.dumps(answer)) is None  # the finish is held
    assert reader.done
    last = reader.finish()
    (end,) = last.choices
    assert (end.reasoning, end.text, end.finish_reason) == ("2+2", "4", "stop")
    assert (end.num_tokens, end.reasoning_tokens, last.prompt_tokens) == (7, 5, 3)


async def test_an_upstream_answering_a_stream_with_one_json_body_is_read_whole() -> None:
    answer = {
        "choices": [
            {"index": 0, "message": {"content": "4", "reasoning": "2+2"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }
    response = httpx.Response(200, json=answer)
    reader = StreamReader(choices=1)
    steps: list[EngineStep] = [step async for step in events(reader, response, True)]
    assert steps == [] and reader.done
    (end,) = reader.finish().choices
    assert (end.reasoning, end.text) == ("2+2", "4")


async def test_the_remote_tokenizer_sends_the_templates_kwargs() -> None:
    asked: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        return httpx.Response(200, json={"count": 2, "tokens": [1, 2]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        remote = RemoteTokenizer(client, "http://10.0.0.1:8000", "m")
        kwargs = {"enable_thinking": False}
        await remote.encode_chat([USER], None, kwargs)
        await remote.encode_chat_counted([USER], 1, None, kwargs)  # counted, then its framing
        await remote.encode_chat([USER])
    assert [a.get("chat_template_kwargs") for a in asked] == [kwargs, kwargs, kwargs, None]

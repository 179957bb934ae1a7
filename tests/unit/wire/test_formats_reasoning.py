"""Reasoning on chat completions, as vLLM's server writes it: `delta.reasoning` in streams,
`message.reasoning` in answers, `completion_tokens_details.reasoning_tokens` in usage, and
none of the thoughts when `include_reasoning` is false."""

from __future__ import annotations

import json
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob
from sluicegate.wire.completion import Collector
from sluicegate.wire.events import EventWriter
from sluicegate.wire.formats import ChatFormat, chat_format
from sluicegate.wire.tools import ToolSetup

DELTAS = [
    ChoiceDelta(0, "", 1, reasoning="Paris is"),
    ChoiceDelta(0, "", 1, reasoning=" the capital."),
    ChoiceDelta(0, "It is", 1, reasoning="\n"),
    ChoiceDelta(0, " Paris.", 1, "stop", reasoning_tokens=3),
]


def _stream(fmt: ChatFormat, deltas: list[ChoiceDelta]) -> list[dict[str, Any]]:
    writer = EventWriter(fmt)
    events = [e for d in deltas for e in writer.events(d)]
    events.append(writer.usage_event(writer.completion(7)))
    return [json.loads(e.removeprefix(b"data: ")) for e in events]


def _copies() -> list[ChoiceDelta]:
    return [ChoiceDelta(**{f: getattr(d, f) for f in d.__slots__}) for d in DELTAS]


def test_a_stream_carries_thoughts_as_delta_reasoning() -> None:
    chunks = _stream(chat_format("m", True, reasons=True), _copies())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"reasoning": "Paris is"},
        {"reasoning": " the capital."},
        {"reasoning": "\n", "content": "It is"},
        {"content": " Paris."},
        {},
    ]
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 7,
        "completion_tokens": 4,
        "total_tokens": 11,
        "completion_tokens_details": {"reasoning_tokens": 3},
    }


def test_an_answer_carries_message_reasoning_and_its_count() -> None:
    collector = Collector([0])
    for delta in _copies():
        collector.add(delta)
    body = chat_format("m", False, reasons=True).response(collector.completion(7))
    assert body["choices"][0]["message"] == {
        "role": "assistant",
        "content": "It is Paris.",
        "reasoning": "Paris is the capital.\n",
    }
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}


def test_a_model_that_reasons_writes_null_reasoning_and_zero_tokens_when_it_did_not_think() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "Paris.", 1, "stop"))
    body = chat_format("m", False, reasons=True).response(collector.completion(7))
    assert body["choices"][0]["message"]["reasoning"] is None
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}


def test_an_answer_of_thoughts_alone_has_null_content_as_vllms() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "", 2, "length", reasoning="Paris is", reasoning_tokens=2))
    message = chat_format("m", False, reasons=True).response(collector.completion(7))
    assert message["choices"][0]["message"]["content"] is None
    assert message["choices"][0]["message"]["reasoning"] == "Paris is"
    empty = Collector([0])
    empty.add(ChoiceDelta(0, "", 1, "stop"))
    plain = chat_format("m", False).response(empty.completion(7))
    assert plain["choices"][0]["message"]["content"] == ""


def test_a_model_without_a_parser_answers_as_before() -> None:
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "Paris.", 1, "stop"))
    body = chat_format("m", False).response(collector.completion(7))
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Paris."}
    assert "completion_tokens_details" not in body["usage"]


def test_include_reasoning_false_leaves_the_thoughts_out_but_counts_them() -> None:
    fmt = chat_format("m", True, reasons=True, include_reasoning=False)
    chunks = _stream(fmt, _copies())
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas == [
        {"role": "assistant", "content": ""},
        {"content": "It is"},
        {"content": " Paris."},
        {},
    ]
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    collector = Collector([0])
    for delta in _copies():
        collector.add(delta)
    message = fmt.response(collector.completion(7))["choices"][0]["message"]
    assert message["reasoning"] is None and message["content"] == "It is Paris."


def test_thoughts_come_before_the_tool_calls_they_led_to() -> None:
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    fmt = chat_format("m", False, ToolSetup(tools, "required"), reasons=True)
    deltas = [
        ChoiceDelta(0, "", 1, reasoning="Call f."),
        ChoiceDelta(0, '[{"name":"f","arguments":{}}]', 1, "stop", reasoning_tokens=1),
    ]
    chunks = _stream(fmt, [ChoiceDelta(**{f: getattr(d, f) for f in d.__slots__}) for d in deltas])
    fields = [list(c["choices"][0]["delta"]) for c in chunks if c["choices"]]
    assert fields[1] == ["reasoning"] and ["tool_calls"] in fields[2:]
    collector = Collector([0])
    for delta in deltas:
        collector.add(delta)
    choice = fmt.response(collector.completion(7))["choices"][0]
    assert choice["message"]["reasoning"] == "Call f."
    assert choice["message"]["tool_calls"][0]["function"]["name"] == "f"
    assert choice["finish_reason"] == "tool_calls"


def test_include_reasoning_false_leaves_the_logprobs_out_too() -> None:
    # Their tokens would show the thoughts: vLLM's server leaves them out as well.
    lp = [TokenLogprob("x", -0.1)]
    deltas = [
        ChoiceDelta(0, "", 1, logprobs=lp, reasoning="Think."),
        ChoiceDelta(0, "Paris.", 1, "stop", logprobs=lp, reasoning_tokens=1),
    ]
    fmt = chat_format("m", False, reasons=True, include_reasoning=False)
    chunks = _stream(fmt, [ChoiceDelta(**{f: getattr(d, f) for f in d.__slots__}) for d in deltas])
    assert all(c["choices"][0]["logprobs"] is None for c in chunks if c["choices"])
    assert [c["choices"][0]["delta"] for c in chunks if c["choices"]][1] == {"content": "Paris."}
    collector = Collector([0])
    for delta in deltas:
        collector.add(delta)
    assert fmt.response(collector.completion(3))["choices"][0]["logprobs"] is None
    shown = chat_format("m", False, reasons=True).response(collector.completion(3))
    assert shown["choices"][0]["logprobs"] is not None


def test_an_answer_of_thoughts_alone_has_null_content_with_tools_offered_too() -> None:
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    collector = Collector([0])
    collector.add(ChoiceDelta(0, "", 2, "length", reasoning="Paris is", reasoning_tokens=2))
    fmt = chat_format("m", False, ToolSetup(tools, "auto"), reasons=True)
    assert fmt.response(collector.completion(7))["choices"][0]["message"]["content"] is None
    plain = chat_format("m", False, ToolSetup(tools, "auto"))
    assert plain.response(collector.completion(7))["choices"][0]["message"]["content"] == ""

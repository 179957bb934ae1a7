"""Turning text into tool calls in the chat format: whole answers, stream deltas, replays."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from sluicegate.engine.protocol import (
    ChoiceDelta,
    ParsedDelta,
    ParsedToolCall,
    ParsedToolCalls,
    ToolCallFragment,
    Tools,
)
from sluicegate.wire.completion import Collector
from sluicegate.wire.events import EventWriter, render_cached
from sluicegate.wire.formats import chat_format
from sluicegate.wire.tool_calls import CallScanner, NamedStream
from sluicegate.wire.tools import NO_TOOLS, ToolSetup

TOOLS = (
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_time"}},
)
REQUIRED = ToolSetup(TOOLS, "required")
NAMED = ToolSetup(TOOLS, "named", "get_weather")
AUTO = ToolSetup(TOOLS, "auto")
CALLS = (
    '[{"name":"get_weather","arguments":{"city":"Pa\\"ris","n":[1,{"x":"}"}]}},'
    '{"name":"get_time","arguments":{}}]'
)


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 2, 5, 13, len(CALLS)])
def test_scanner_finds_the_same_calls_however_the_text_is_cut(size: int) -> None:
    scanner = CallScanner()
    deltas = [d for piece in pieces(CALLS, size) for d in scanner.feed(piece).calls]
    deltas += scanner.finish().calls
    assert [(name, args) for _, name, args in scanner.calls()] == [
        ("get_weather", '{"city":"Pa\\"ris","n":[1,{"x":"}"}]}'),
        ("get_time", "{}"),
    ]
    # Each call opens once (id, name, empty arguments), then only argument text follows.
    openings = [d for d in deltas if d.name is not None]
    assert [(d.index, d.name, d.arguments) for d in openings] == [
        (0, "get_weather", ""),
        (1, "get_time", ""),
    ]
    for index in (0, 1):
        streamed = "".join(d.arguments for d in deltas if d.index == index)
        assert streamed == scanner.calls()[index][2]


def test_scanner_handles_whitespace_key_order_and_escaped_names() -> None:
    text = '[ {"arguments" : {"a": "]"} , "name" : "get_\\u0074ime" } ]'
    scanner = CallScanner()
    for piece in pieces(text, 3):
        scanner.feed(piece)
    assert [(n, a) for _, n, a in scanner.calls()] == [("get_time", '{"a": "]"}')]


def test_scanner_of_cut_output_opens_only_named_calls() -> None:
    scanner = CallScanner()
    scanner.feed('[{"name":"get_weather","arguments":{"ci')
    scanner.feed("")
    assert [(n, a) for _, n, a in scanner.calls()] == [("get_weather", '{"ci')]
    assert CallScanner().feed('[{"name":"get_w').calls == []


def test_named_stream_is_the_arguments_without_surrounding_whitespace() -> None:
    stream = NamedStream("f")
    deltas = [d for p in ["  \n", '{"a":', " 1}", " \n"] for d in stream.feed(p).calls]
    assert deltas[0].name == "f" and deltas[0].arguments == ""
    assert "".join(d.arguments for d in deltas) == '{"a": 1}'
    assert stream.calls()[0][1:] == ("f", '{"a": 1}')


class FakeParser:
    """A stand-in for a tool parser (not vLLM's): calls are `CALL name {json}` lines."""

    name = "fake"
    reads_forced = False

    def extract(self, text: str, tools: Tools) -> ParsedToolCalls:
        if "CALL " not in text:
            return ParsedToolCalls(text)
        head, _, rest = text.partition("CALL ")
        calls = []
        for line in ("CALL " + rest).splitlines():
            _, name, arguments = line.split(" ", 2)
            calls.append(ParsedToolCall(name, arguments))
        return ParsedToolCalls(head or None, tuple(calls))

    def stream(self, tools: Tools) -> FakeStream:
        return FakeStream()


class FakeStream:
    """Streams content until `CALL`, then the name, then argument text (one call)."""

    def __init__(self) -> None:
        self.text = ""
        self.sent_args = 0
        self.named = False

    def feed(self, text: str) -> ParsedDelta:
        before, self.text = self.text, self.text + text
        if "CALL " not in self.text:
            return ParsedDelta(content=text)
        fragments = []
        content = before and None
        _, _, rest = self.text.partition("CALL ")
        name, space, arguments = rest.partition(" ")
        if space and not self.named:
            self.named = True
            fragments.append(ToolCallFragment(0, name))
        if self.named and len(arguments) > self.sent_args:
            fragments.append(ToolCallFragment(0, None, arguments[self.sent_args :]))
            self.sent_args = len(arguments)
        return ParsedDelta(content, tuple(fragments))


def deltas_of(parts: list[str], finish: str = "stop") -> list[ChoiceDelta]:
    deltas = [ChoiceDelta(0, p, 1) for p in parts]
    deltas.append(ChoiceDelta(0, "", 0, finish))  # type: ignore[arg-type]
    return deltas


def stream_events(setup: ToolSetup, parts: list[str], finish: str = "stop") -> list[dict[str, Any]]:
    writer = EventWriter(chat_format("m", False, setup, FakeParser()))
    events = [e for d in deltas_of(parts, finish) for e in writer.events(d)]
    return [json.loads(e[6:]) for e in events]


def answer(setup: ToolSetup, parts: list[str], finish: str = "stop") -> dict[str, Any]:
    collector = Collector([0])
    for delta in deltas_of(parts, finish):
        collector.add(delta)
    body = chat_format("m", False, setup, FakeParser()).response(collector.completion(3))
    return body["choices"][0]  # type: ignore[no-any-return]


def streamed_calls(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """What a client accumulating `tool_calls` deltas ends with."""
    calls: dict[int, list[str]] = {}
    for event in events:
        for call in event["choices"][0]["delta"].get("tool_calls", []):
            entry = calls.setdefault(call["index"], ["", ""])
            if "id" in call:
                assert call["id"].startswith("call_") and call["type"] == "function"
                entry[0] = call["function"]["name"]
            entry[1] += call["function"]["arguments"]
    return [tuple(calls[i]) for i in sorted(calls)]  # type: ignore[misc]


@pytest.mark.parametrize("size", [1, 4, 1000])
def test_required_answer_and_stream_give_the_same_calls(size: int) -> None:
    choice = answer(REQUIRED, pieces(CALLS, size))
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls" and message["content"] is None
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
    assert calls[0] == ("get_weather", '{"city":"Pa\\"ris","n":[1,{"x":"}"}]}')
    assert all(
        c["id"].startswith("call_") and c["type"] == "function" for c in message["tool_calls"]
    )
    events = stream_events(REQUIRED, pieces(CALLS, size))
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert streamed_calls(events) == calls
    assert events[-1]["choices"][0] == {
        "index": 0,
        "delta": {},
        "logprobs": None,
        "finish_reason": "tool_calls",
    }
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_named_call_finishes_with_stop_as_openai_does() -> None:
    choice = answer(NAMED, ['{"city":', ' "Rome"}'])
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "get_weather",
        "arguments": '{"city": "Rome"}',
    }
    events = stream_events(NAMED, ['{"city":', ' "Rome"}'])
    assert streamed_calls(events) == [("get_weather", '{"city": "Rome"}')]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


def test_cut_required_output_keeps_length_and_its_partial_arguments() -> None:
    choice = answer(REQUIRED, ['[{"name":"get_time","arguments":{"tz'], "length")
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"tz'


def test_auto_with_a_parser_finds_calls_in_answers_and_streams() -> None:
    text = ["Let me see.", "CALL get_", 'time {"tz":', ' "UTC"}']
    choice = answer(AUTO, text)
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me see."
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "get_time",
        "arguments": '{"tz": "UTC"}',
    }
    events = stream_events(AUTO, text)
    contents = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert contents == "Let me see."
    assert streamed_calls(events) == [("get_time", '{"tz": "UTC"}')]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_keeps_the_first_call_only_without_parallel_tool_calls() -> None:
    text = ["CALL get_time {}", '\nCALL get_weather {"city": "Paris"}']
    names = [c["function"]["name"] for c in answer(AUTO, text)["message"]["tool_calls"]]
    assert names == ["get_time", "get_weather"]
    single = dataclasses.replace(AUTO, parallel=False)
    calls = answer(single, text)["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("get_time", "{}")
    ]


def test_auto_text_stays_text() -> None:
    choice = answer(AUTO, ["Just ", "words."])
    assert choice["message"] == {"role": "assistant", "content": "Just words."}
    assert choice["finish_reason"] == "stop"
    events = stream_events(AUTO, ["Just ", "words."])
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-1]] == ["Just ", "words."]


def test_auto_without_a_parser_and_none_answer_with_text() -> None:
    collector = Collector([0])
    for delta in deltas_of(["CALL get_time {}"]):
        collector.add(delta)
    for setup, parser in ((AUTO, None), (ToolSetup(TOOLS, "none"), FakeParser()), (NO_TOOLS, None)):
        body = chat_format("m", False, setup, parser).response(collector.completion(1))
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "CALL get_time {}"}
        assert body["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_cached_tool_call_renders_the_same_calls(stream: bool) -> None:
    collector = Collector([0])
    for delta in deltas_of(pieces(CALLS, 7)):
        collector.add(delta)
    completion = collector.completion(5)
    first = chat_format("m", False, REQUIRED, None)
    renders = [render_cached(f, completion, stream, False).body for f in (first, first.renewed())]

    def calls(body: bytes) -> list[tuple[str, str]]:
        if not stream:
            message = json.loads(body)["choices"][0]["message"]
            return [
                (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
            ]
        lines = [
            json.loads(line[6:]) for line in body.split(b"\n\n") if line.startswith(b"data: {")
        ]
        return streamed_calls(lines)

    assert calls(renders[0]) == calls(renders[1])
    assert calls(renders[0])[1] == ("get_time", "{}")


def test_rendered_choices_are_counted_by_mode_and_outcome() -> None:
    from sluicegate.observability.metrics import TOOL_CALL_CHOICES, TOOL_CALLS

    def value(mode: str, outcome: str) -> float:
        return TOOL_CALL_CHOICES.labels(mode, outcome)._value.get()  # type: ignore[no-any-return]

    before = (value("required", "called"), value("required", "invalid_arguments"))
    calls_before = TOOL_CALLS.labels("required")._value.get()
    answer(REQUIRED, [CALLS])
    answer(REQUIRED, ['[{"name":"get_time","arguments":{"tz'], "length")
    assert value("required", "called") == before[0] + 1
    assert value("required", "invalid_arguments") == before[1] + 1
    assert TOOL_CALLS.labels("required")._value.get() == calls_before + 3
    text_before = value("auto", "text")
    answer(AUTO, ["no call"])
    assert value("auto", "text") == text_before + 1


def test_the_span_names_the_tools_and_a_forced_function() -> None:
    from sluicegate.inference.telemetry import tool_attributes

    assert tool_attributes(NAMED) == {
        "sluicegate.tool_choice": "named",
        "sluicegate.tools.count": 2,
        "sluicegate.tools.names": ["get_weather", "get_time"],
        "gen_ai.tool.name": "get_weather",
        "gen_ai.tool.type": "function",
    }
    assert "gen_ai.tool.name" not in tool_attributes(AUTO)


def test_legacy_functions_are_answered_with_function_call() -> None:
    legacy = ToolSetup(TOOLS, "auto", legacy=True)
    text = ["CALL get_time", ' {"tz": "UTC"}']
    choice = answer(legacy, text)
    assert choice["finish_reason"] == "function_call"
    assert "tool_calls" not in choice["message"]
    assert choice["message"]["function_call"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}
    deltas = [e["choices"][0]["delta"] for e in stream_events(legacy, text)]
    calls = [d["function_call"] for d in deltas if "function_call" in d]
    assert calls[0] == {"name": "get_time", "arguments": ""}
    assert "".join(c["arguments"] for c in calls) == '{"tz": "UTC"}'
    named = answer(ToolSetup(TOOLS, "named", "get_weather", legacy=True), ["{}"])
    assert named["message"]["function_call"] == {"name": "get_weather", "arguments": "{}"}
    assert named["finish_reason"] == "stop"

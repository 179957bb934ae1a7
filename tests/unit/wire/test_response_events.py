"""The Responses stream from a fake delta source: event order, numbering, the final object,
tool calls (from a fake chat format that makes them), reasoning, failures, and cached
replays."""

from __future__ import annotations

import json
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import EngineUnavailableError
from sluicegate.wire.completion import ChoiceState, Collector, Completion
from sluicegate.wire.events import render_cached, stream_writer
from sluicegate.wire.formats import ChatFormat, chat_format
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.response_body import ResponseEnvelope
from sluicegate.wire.response_format import ResponsesFormat
from sluicegate.wire.responses import ResponsesRequest

TEXT_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def responses_format(
    chat: ChatFormat | None = None, seal: ReasoningSeal | None = None
) -> ResponsesFormat:
    echo = ResponsesRequest(model="m", input="hi").echo()
    envelope = ResponseEnvelope("m", echo, seal=seal)
    return ResponsesFormat(chat or chat_format("m", False, reasons=True), envelope)


def fake_deltas(words: list[str], finish: str = "stop") -> list[ChoiceDelta]:
    deltas = [ChoiceDelta(0, w, 1, None) for w in words]
    deltas[-1].finish_reason = finish  # type: ignore[assignment]
    return deltas


def parse(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in stream.decode().split("\n\n"):
        if not block:
            continue
        name, data = block.split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def live_stream(fmt: ResponsesFormat, deltas: list[ChoiceDelta], prompt_tokens: int = 4) -> bytes:
    writer = stream_writer(fmt)
    out = [event for delta in deltas for event in writer.events(delta)]
    out += writer.closing(writer.completion(prompt_tokens), False)
    return b"".join(out) + writer.done()


def test_a_text_stream_sends_the_standard_events_in_order_numbered() -> None:
    events = parse(live_stream(responses_format(), fake_deltas(["Hel", "lo"])))
    assert [name for name, _ in events] == TEXT_EVENTS
    assert all(data["type"] == name for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    deltas = [d["delta"] for n, d in events if n == "response.output_text.delta"]
    assert "".join(deltas) == "Hello"
    added = events[2][1]
    assert all(
        d["item_id"] == added["item"]["id"] and d["output_index"] == 0
        for n, d in events
        if n.startswith("response.output_text")
    )


def test_the_last_event_carries_the_whole_response_and_the_format_keeps_it() -> None:
    fmt = responses_format()
    events = parse(live_stream(fmt, fake_deltas(["a", "b"]), prompt_tokens=5))
    final = events[-1][1]["response"]
    assert final == fmt.final
    assert final["status"] == "completed" and final["object"] == "response"
    assert final["output"][0]["content"][0]["text"] == "ab"
    assert final["usage"]["input_tokens"] == 5 and final["usage"]["output_tokens"] == 2
    assert final["usage"]["total_tokens"] == 7
    assert events[0][1]["response"]["status"] == "in_progress"


def test_a_stream_cut_by_max_output_tokens_ends_incomplete() -> None:
    events = parse(live_stream(responses_format(), fake_deltas(["a"], finish="length")))
    name, data = events[-1]
    assert name == "response.incomplete"
    assert data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["response"]["output"][0]["status"] == "incomplete"


def test_no_output_still_gives_one_empty_message() -> None:
    events = parse(live_stream(responses_format(), [ChoiceDelta(0, "", 1, "stop")]))
    assert [n for n, _ in events] == [n for n in TEXT_EVENTS if "delta" not in n]
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == ""


class FakeToolChatFormat(ChatFormat):
    """Not our chat format: one that turns every delta into arguments of one tool call, as
    a chat format that parses tool calls streams them."""

    def delta_chunk(self, state: ChoiceState, delta: ChoiceDelta) -> dict[str, Any]:
        call: dict[str, Any] = {"index": 0, "function": {"arguments": delta.text}}
        if state.text_length == len(delta.text):
            call.update(id="call_1", type="function")
            call["function"]["name"] = "get_weather"
        choice = {"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}
        return self.chunk(self.CHUNK, [choice])

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        """The same, for a chat format whose deltas make a list of chunks (i17-tools)."""
        return [self.delta_chunk(state, delta)]

    def response(self, completion: Completion) -> dict[str, Any]:
        body = super().response(completion)
        message = body["choices"][0]["message"]
        message["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": message["content"]},
            }
        ]
        message["content"] = None
        return body


def tool_format() -> ResponsesFormat:
    return responses_format(FakeToolChatFormat("chatcmpl-x", 0, "m", False))


def test_tool_call_deltas_stream_as_a_function_call_item() -> None:
    events = parse(live_stream(tool_format(), fake_deltas(['{"city":', '"Paris"}'])))
    assert [n for n, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2][1]["item"]["type"] == "function_call"
    assert events[2][1]["item"]["name"] == "get_weather"
    done = events[5][1]
    assert done["arguments"] == '{"city":"Paris"}' and done["name"] == "get_weather"
    item = events[-1][1]["response"]["output"][0]
    assert item["type"] == "function_call" and item["call_id"] == "call_1"
    assert item["arguments"] == '{"city":"Paris"}'


def test_tool_calls_in_a_body_become_function_call_items() -> None:
    collector = Collector([0])
    for delta in fake_deltas(['{"a":1}']):
        collector.add(delta)
    output = tool_format().response(collector.completion(3))["output"]
    assert [i["type"] for i in output] == ["function_call"]
    assert output[0]["name"] == "get_weather" and output[0]["arguments"] == '{"a":1}'


def test_a_failure_after_the_first_byte_ends_with_error_and_response_failed() -> None:
    fmt = responses_format()
    writer = stream_writer(fmt)
    sent = b"".join(writer.events(ChoiceDelta(0, "par", 1, None)))
    events = parse(sent + writer.error(EngineUnavailableError()))
    (error_name, error), (failed_name, failed) = events[-2:]
    assert (error_name, failed_name) == ("error", "response.failed")
    assert error["code"] == "engine_unavailable" and error["message"]
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"]["code"] == "engine_unavailable"
    assert failed["response"]["output"][0]["content"][0]["text"] == "par"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert writer.done() == b""  # no [DONE] in a Responses stream


def test_a_cached_completion_replays_as_the_live_stream_did() -> None:
    deltas = fake_deltas(["x", "y", "z"])
    live = parse(live_stream(responses_format(), deltas))
    collector = Collector([0])
    for delta in fake_deltas(["x", "y", "z"]):
        collector.add(delta)
    fmt = responses_format()
    cached = render_cached(fmt, collector.completion(4), stream=True, include_usage=False)
    replayed = parse(cached.body)
    assert [n for n, _ in replayed] == [n for n, _ in live]
    assert replayed[-1][1]["response"]["output"][0]["content"][0]["text"] == "xyz"
    assert fmt.final is not None and fmt.final["usage"]["output_tokens"] == 3


def test_a_cached_completion_renders_the_same_body() -> None:
    collector = Collector([0])
    for delta in fake_deltas(["x", "y"]):
        collector.add(delta)
    fmt = responses_format()
    body = json.loads(render_cached(fmt, collector.completion(4), False, False).body)
    assert body == fmt.final and body["output"][0]["content"][0]["text"] == "xy"
    assert body["id"].startswith("resp_") and body["output"][0]["id"].startswith("msg_")


REASONING_EVENTS = [
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def thinking(thoughts: list[str], words: list[str], finish: str = "stop") -> list[ChoiceDelta]:
    """Thoughts first, then words, as a reasoning parser splits them."""
    deltas = [ChoiceDelta(0, "", 1, None, reasoning=t) for t in thoughts]
    deltas += fake_deltas(words, finish) if words else []
    deltas[-1].reasoning_tokens = len(thoughts)
    if not words:
        deltas[-1].finish_reason = finish  # type: ignore[assignment]
    return deltas


def test_reasoning_streams_as_its_own_item_before_the_message() -> None:
    events = parse(live_stream(responses_format(), thinking(["Th", "ink."], ["Hel", "lo"])))
    names = [n for n, _ in events]
    assert names == [*TEXT_EVENTS[:2], *REASONING_EVENTS, *TEXT_EVENTS[2:]]
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    added = events[2][1]["item"]
    assert added["type"] == "reasoning" and added["status"] == "in_progress"
    assert events[3][1]["part"] == {"type": "reasoning_text", "text": ""}
    reasoning = [d for n, d in events[2:9]]
    assert all(d["output_index"] == 0 for d in reasoning)
    assert all(d["item_id"] == added["id"] for d in reasoning[1:-1])
    assert [d["delta"] for d in reasoning[2:4]] == ["Th", "ink."]
    assert reasoning[4]["text"] == "Think." and reasoning[4]["content_index"] == 0
    assert reasoning[5]["part"] == {"type": "reasoning_text", "text": "Think."}
    done = reasoning[6]["item"]
    assert done["id"] == added["id"] and done["status"] == "completed"
    assert done["content"] == [{"type": "reasoning_text", "text": "Think."}]
    assert done["encrypted_content"] is None
    message = [d for _, d in events[9:-1]]
    assert all(d["output_index"] == 1 for d in message)
    final = events[-1][1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0] == done and final["output"][1]["content"][0]["text"] == "Hello"
    assert final["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


def test_a_chunk_with_thoughts_and_text_ends_the_reasoning_before_the_text() -> None:
    both = ChoiceDelta(0, "Hi", 1, "stop", reasoning=" done.", reasoning_tokens=2)
    deltas = [ChoiceDelta(0, "", 1, None, reasoning="Almost"), both]
    events = parse(live_stream(responses_format(), deltas))
    names = [n for n, _ in events]
    assert names[names.index("response.reasoning_text.done") - 1] == "response.reasoning_text.delta"
    assert names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
    final = events[-1][1]["response"]["output"]
    assert (
        final[0]["content"][0]["text"] == "Almost done." and final[1]["content"][0]["text"] == "Hi"
    )


def test_with_a_seal_the_done_item_and_the_response_carry_the_text_sealed() -> None:
    seal = ReasoningSeal([b"e" * 32])
    events = parse(live_stream(responses_format(seal=seal), thinking(["A", "B"], ["x"])))
    added, done = [d["item"] for n, d in events if n.startswith("response.output_item")][:2]
    assert added["encrypted_content"] is None
    assert seal.open(done["encrypted_content"]) == "AB"
    assert events[-1][1]["response"]["output"][0] == done


def test_a_stream_of_thoughts_only_cut_short_ends_with_the_reasoning_incomplete() -> None:
    events = parse(live_stream(responses_format(), thinking(["a", "b"], [], finish="length")))
    assert [n for n, _ in events] == [*TEXT_EVENTS[:2], *REASONING_EVENTS, "response.incomplete"]
    (item,) = events[-1][1]["response"]["output"]
    assert item["type"] == "reasoning" and item["status"] == "incomplete"


class FakeThinkingToolChatFormat(FakeToolChatFormat):
    """The fake tool format, its thoughts in chunks of their own before the calls (as the chat
    format writes them with tools)."""

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        if delta.reasoning:
            choice = {"index": 0, "delta": {"reasoning": delta.reasoning}, "finish_reason": None}
            return [self.chunk(self.CHUNK, [choice])]
        return super().delta_chunks(state, delta)


def test_thoughts_before_a_tool_call_are_their_own_item() -> None:
    fmt = responses_format(FakeThinkingToolChatFormat("chatcmpl-x", 0, "m", False))
    deltas = [ChoiceDelta(0, "", 1, None, reasoning="Call it."), *fake_deltas(['{"a":1}'])]
    events = parse(live_stream(fmt, deltas))
    done = [(d["item"]["type"], d["output_index"]) for n, d in events if n.endswith("item.done")]
    assert done == [("reasoning", 0), ("function_call", 1)]
    indexes = [d["output_index"] for n, d in events if n.startswith("response.function_call")]
    assert indexes == [1, 1]


def test_a_failure_while_thinking_keeps_the_thoughts_as_incomplete() -> None:
    writer = stream_writer(responses_format())
    sent = b"".join(writer.events(ChoiceDelta(0, "", 1, None, reasoning="Hmm")))
    events = parse(sent + writer.error(EngineUnavailableError()))
    (item,) = events[-1][1]["response"]["output"]
    assert item["type"] == "reasoning" and item["status"] == "incomplete"
    assert item["content"][0]["text"] == "Hmm"


def test_a_cached_completion_with_thoughts_replays_and_renders_as_the_live_one() -> None:
    live_format = responses_format()
    live = parse(live_stream(live_format, thinking(["p", "q"], ["x", "y"])))
    collector = Collector([0])
    for delta in thinking(["p", "q"], ["x", "y"]):
        collector.add(delta)
    replay = parse(
        render_cached(
            responses_format(), collector.completion(4), stream=True, include_usage=False
        ).body
    )
    assert [n for n, _ in replay] == [n for n, _ in live]
    body_format = responses_format()
    body = json.loads(render_cached(body_format, collector.completion(4), False, False).body)

    def shape(response: dict[str, Any]) -> list[Any]:
        return [{k: v for k, v in i.items() if k != "id"} for i in response["output"]]

    assert shape(body) == shape(replay[-1][1]["response"]) == shape(live[-1][1]["response"])
    assert body["usage"] == live[-1][1]["response"]["usage"]

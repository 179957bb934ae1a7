"""Anthropic's Messages stream from chat deltas: a thinking block (its `thinking_delta`s, then
its `signature_delta` before its stop) ahead of the text and tool_use blocks, each at its
index; no thinking block without thoughts; a cached replay signing as the live stream did."""

from __future__ import annotations

import json
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.completion import Collector
from sluicegate.wire.events import render_cached, stream_writer
from sluicegate.wire.formats import chat_format
from sluicegate.wire.message_body import MessageEnvelope
from sluicegate.wire.message_format import MessagesFormat
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.tools import ToolSetup

SEAL = ReasoningSeal([b"k" * 32])
THOUGHTS = ["The user", " greets é", " 🙂."]
WORDS = ["Hello", " there"]


def messages_format(tools: ToolSetup | None = None) -> MessagesFormat:
    chat = chat_format("m", True) if tools is None else chat_format("m", True, tools)
    return MessagesFormat(chat, MessageEnvelope("m", SEAL), prompt_tokens=4)


def deltas(thoughts: list[str], words: list[str]) -> list[ChoiceDelta]:
    made = [ChoiceDelta(0, "", 1, None, reasoning=t) for t in thoughts]
    made += [ChoiceDelta(0, w, 1, None) for w in words]
    made[-1].finish_reason = "stop"
    return made


def parse(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for block in stream.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name.removeprefix("event: ") == event["type"]
        found.append((event["type"], event))
    return found


def live_stream(fmt: MessagesFormat, sent: list[ChoiceDelta]) -> bytes:
    writer = stream_writer(fmt)
    out = [event for delta in sent for event in writer.events(delta)]
    out += writer.closing(writer.completion(4), True)
    return b"".join(out) + writer.done()


def blocks(events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, int, str]]:
    """Each content block event as (name, index, block or delta type)."""
    shown = []
    for name, event in events:
        if name == "content_block_start":
            shown.append((name, event["index"], event["content_block"]["type"]))
        elif name == "content_block_delta":
            shown.append((name, event["index"], event["delta"]["type"]))
        elif name == "content_block_stop":
            shown.append((name, event["index"], ""))
    return shown


def block_deltas(events: list[tuple[str, dict[str, Any]]], kind: str) -> list[dict[str, Any]]:
    """The `content_block_delta`s' deltas of type `kind`."""
    return [
        e["delta"] for n, e in events if n == "content_block_delta" and e["delta"]["type"] == kind
    ]


def test_the_thoughts_are_a_signed_thinking_block_before_the_text() -> None:
    events = parse(live_stream(messages_format(), deltas(THOUGHTS, WORDS)))
    assert events[0][0] == "message_start"
    assert blocks(events) == [
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, ""),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, ""),
    ]
    assert [name for name, _ in events][-2:] == ["message_delta", "message_stop"]
    opened = next(e for n, e in events if n == "content_block_start")
    assert opened["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    thought = "".join(d["thinking"] for d in block_deltas(events, "thinking_delta"))
    assert thought == "".join(THOUGHTS)
    (signature,) = [d["signature"] for d in block_deltas(events, "signature_delta")]
    # The running digest of the deltas signs as the whole text does.
    assert signature == SEAL.sign(thought) and SEAL.verify(thought, signature)
    usage = events[-2][1]["usage"]
    assert usage["output_tokens"] == len(THOUGHTS) + len(WORDS)


def test_without_thoughts_there_is_no_thinking_block() -> None:
    events = parse(live_stream(messages_format(), deltas([], WORDS)))
    assert blocks(events) == [
        ("content_block_start", 0, "text"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_delta", 0, "text_delta"),
        ("content_block_stop", 0, ""),
    ]
    assert "thinking" not in json.dumps([e for _, e in events])


def test_a_tool_call_after_thoughts_opens_its_block_after_the_signed_thinking() -> None:
    tools = ToolSetup(
        tools=({"type": "function", "function": {"name": "get_weather", "parameters": {}}},),
        mode="named",
        function="get_weather",
    )
    sent = deltas(["Look it up."], ['{"city": ', '"Paris"}'])
    events = parse(live_stream(messages_format(tools), sent))
    shown = blocks(events)
    assert shown[:4] == [
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"),
        ("content_block_stop", 0, ""),
    ]
    assert shown[4] == ("content_block_start", 1, "tool_use")
    assert shown[-1] == ("content_block_stop", 1, "")
    assert {kind for _, index, kind in shown[5:-1]} == {"input_json_delta"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"


def test_a_cached_replay_signs_as_the_live_stream_did() -> None:
    sent = deltas(THOUGHTS, WORDS)
    live = parse(live_stream(messages_format(), sent))
    collector = Collector([0])
    for delta in deltas(THOUGHTS, WORDS):
        collector.add(delta)
    replayed = parse(render_cached(messages_format(), collector.completion(4), True, True).body)
    assert blocks(replayed) == blocks(live)
    (live_signature,) = block_deltas(live, "signature_delta")
    (replayed_signature,) = block_deltas(replayed, "signature_delta")
    assert replayed_signature == live_signature
    assert live_signature["signature"] == SEAL.sign("".join(THOUGHTS))

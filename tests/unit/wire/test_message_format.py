"""Anthropic's message object from a completion: the thoughts a signed `thinking` block ahead
of the text and tool_use blocks, none without thoughts; a renewed format and a cached answer
sign alike."""

from __future__ import annotations

import json

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.completion import Collector, Completion
from sluicegate.wire.events import render_cached
from sluicegate.wire.formats import chat_format
from sluicegate.wire.message_body import MessageEnvelope
from sluicegate.wire.message_format import MessagesFormat
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.tools import ToolSetup

SEAL = ReasoningSeal([b"s" * 32])


def completion(thoughts: list[str], words: list[str]) -> Completion:
    collector = Collector([0])
    for thought in thoughts:
        collector.add(ChoiceDelta(0, "", 1, None, reasoning=thought))
    for word in words:
        collector.add(ChoiceDelta(0, word, 1, None))
    collector.add(ChoiceDelta(0, "", 0, "stop"))
    return collector.completion(5)


def messages_format(tools: ToolSetup | None = None) -> MessagesFormat:
    chat = chat_format("m", False) if tools is None else chat_format("m", False, tools)
    return MessagesFormat(chat, MessageEnvelope("m", SEAL), prompt_tokens=5)


def test_the_thoughts_are_a_signed_thinking_block_first() -> None:
    body = messages_format().response(completion(["Two", " and two."], ["Four", "."]))
    thinking, text = body["content"]
    assert thinking == {
        "type": "thinking",
        "thinking": "Two and two.",
        "signature": SEAL.sign("Two and two."),
    }
    assert text == {"type": "text", "text": "Four."}
    # Anthropic has no count of thinking tokens apart: they are output tokens.
    assert body["usage"]["output_tokens"] == 4


def test_without_thoughts_there_is_no_thinking_block() -> None:
    body = messages_format().response(completion([], ["Four", "."]))
    assert body["content"] == [{"type": "text", "text": "Four."}]


def test_thoughts_before_a_tool_call_come_first() -> None:
    tools = ToolSetup(
        tools=({"type": "function", "function": {"name": "lookup", "parameters": {}}},),
        mode="named",
        function="lookup",
    )
    body = messages_format(tools).response(completion(["Look."], ['{"q": ', '"x"}']))
    assert [block["type"] for block in body["content"]] == ["thinking", "tool_use"]
    assert body["content"][1]["input"] == {"q": "x"} and body["stop_reason"] == "tool_use"


def test_a_renewed_format_and_a_cached_answer_sign_as_the_first_did() -> None:
    fmt = messages_format()
    done = completion(["Hmm."], ["Yes"])
    first = fmt.response(done)
    again = fmt.renewed().response(done)
    cached = json.loads(render_cached(fmt.renewed(), done, False, False).body)
    assert again["id"] != first["id"]
    assert again["content"] == first["content"] == cached["content"]
    assert cached["usage"]["cache_read_input_tokens"] == 5

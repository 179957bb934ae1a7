"""Reasoning items in a Responses conversation: the shapes clients send back (OpenAI's SDK, the
Agents SDK's nulls), what is refused, and the assistant turn each one joins, as vLLM's server
groups them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sluicegate.wire.response_items import Item, chat_groups, chat_messages, reasoning_of
from sluicegate.wire.responses import ResponsesRequest

USER: Item = {"role": "user", "content": "q"}
TEXT: Item = {"role": "assistant", "content": [{"type": "output_text", "text": "answer"}]}
CALL: Item = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT: Item = {"type": "function_call_output", "call_id": "c1", "output": "done"}


def thought(text: str, **fields: Any) -> Item:
    return {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        **fields,
    }


def checked(*items: Item) -> list[Item]:
    return ResponsesRequest.model_validate({"model": "m", "input": list(items)}).input_items()


def test_a_reasoning_item_and_the_text_after_it_are_one_assistant_turn() -> None:
    messages = chat_messages(checked(USER, thought("Think."), TEXT, USER))
    assert messages == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer", "reasoning": "Think."},
        {"role": "user", "content": "q"},
    ]


def test_reasoning_then_function_calls_are_one_turn_and_its_outputs_follow() -> None:
    second = {**CALL, "call_id": "c2"}
    items = checked(USER, thought("Call f."), CALL, second, OUTPUT, thought("Now say."), TEXT)
    messages = chat_messages(items)
    assert messages[1]["reasoning"] == "Call f." and messages[1]["content"] is None
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "done"}
    assert messages[3] == {"role": "assistant", "content": "answer", "reasoning": "Now say."}


def test_items_join_a_turn_as_vllm_attaches_them() -> None:
    # A second reasoning item begins a turn of its own; one after a turn's text joins it, as
    # does text after the turn's calls; text after text does not.
    items = [USER, thought("a"), thought("b"), TEXT, CALL, TEXT, thought("c"), TEXT]
    assert chat_groups(items) == [[0], [1], [2, 3, 4], [5, 6], [7]]
    messages = chat_messages(items)
    assert len(messages) == 5
    assert messages[1] == {"role": "assistant", "content": None, "reasoning": "a"}
    assert messages[2]["reasoning"] == "b" and messages[2]["content"] == "answer"
    assert messages[3] == {"role": "assistant", "content": "answer", "reasoning": "c"}


def test_a_reasoning_item_without_content_gives_its_summary() -> None:
    summary = [
        {"type": "summary_text", "text": "First."},
        {"type": "summary_text", "text": "Then."},
    ]
    assert reasoning_of(thought("Own.", summary=summary)) == "Own."
    assert reasoning_of({"type": "reasoning", "summary": summary}) == "First.\n\nThen."
    assert reasoning_of({"type": "reasoning", "summary": summary, "content": []}) == (
        "First.\n\nThen."
    )
    assert reasoning_of({"type": "reasoning", "summary": []}) == ""


def test_the_shapes_sdks_send_back_are_accepted() -> None:
    agents_sdk = thought("x", encrypted_content=None, status=None)
    no_content = {"type": "reasoning", "id": "rs_2", "summary": [], "content": None}
    listed = thought("y", encrypted_content=None, status="completed")
    no_id = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "z"}]}
    items = checked(USER, agents_sdk, TEXT, USER, no_content, USER, listed, TEXT, USER, no_id)
    assert [m.get("reasoning") for m in chat_messages(items)] == [
        None,
        "x",
        None,
        "",
        None,
        "y",
        None,
        "z",
    ]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"summary": "text"}, "input[1].summary must be a list of summary_text parts"),
        ({"summary": [{"text": "t"}]}, "input[1].summary[0] must be a summary_text part"),
        (
            {"content": [{"type": "output_text", "text": "t"}]},
            "input[1].content[0] must be a reasoning_text part",
        ),
        ({"content": [{"type": "reasoning_text"}]}, "input[1].content[0] must be"),
        ({"encrypted_content": 7}, "input[1].encrypted_content must be a string"),
        ({"status": "done"}, "input[1].status must be one of"),
        ({"content": [{"type": "reasoning_text", "text": "\ud800"}]}, "surrogate"),
    ],
)
def test_a_malformed_reasoning_item_is_refused_naming_where(
    item: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        checked(USER, {"type": "reasoning", "summary": [], **item})
    assert message in str(caught.value)

"""The conversation a truncated Responses run used, mapped back to its items."""

from __future__ import annotations

from typing import Any

from sluicegate.conversation.fitted import fitted_items, message_groups
from sluicegate.inference.truncation import TruncatedChat
from sluicegate.wire.response_body import identified
from sluicegate.wire.response_items import Item, chat_messages

ITEMS: list[Item] = identified(
    [
        {"role": "user", "content": "First question.  Long."},
        {"role": "assistant", "content": "First answer."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one. two. three."},
        {"type": "function_call_output", "call_id": "c2", "output": "four"},
        {"role": "user", "content": [{"type": "input_text", "text": "Last question?"}]},
    ]
)


def truncated(kept: list[int], contents: dict[int, str] | None = None) -> TruncatedChat:
    messages = chat_messages(ITEMS, "Be brief.")
    fitted: list[dict[str, Any]] = []
    for position in kept:
        message = dict(messages[position])
        if position in (contents or {}):
            message["content"] = (contents or {})[position]
        elif message["content"] is None:
            message["content"] = ""  # as the template takes it
        fitted.append(message)
    return TruncatedChat([], fitted, tuple(kept), ("drop_turns",))


def test_groups_follow_the_chat_messages_the_items_become() -> None:
    for instructions in (None, "Be brief."):
        groups = message_groups(ITEMS, instructions is not None)
        assert len(groups) == len(chat_messages(ITEMS, instructions))
    assert message_groups(ITEMS, True) == [[], [0], [1, 2, 3], [4], [5], [6]]
    calls_first = ITEMS[2:4]
    assert message_groups(calls_first, False) == [[0, 1]]


def test_dropped_messages_go_and_the_instructions_are_not_stored() -> None:
    kept = fitted_items(ITEMS, truncated([0, 3, 4, 5]), instructions=True)
    assert kept == [ITEMS[4], ITEMS[5], ITEMS[6]]


def test_an_assistant_message_keeps_its_function_calls_with_it() -> None:
    kept = fitted_items(ITEMS, truncated([0, 2, 3, 4, 5]), instructions=True)
    assert kept == ITEMS[1:]


def test_cut_or_collapsed_texts_are_stored_as_the_prompt_held_them() -> None:
    fit = truncated([0, 1, 3, 4, 5], {1: "First question. Long.", 3: "three."})
    kept = fitted_items(ITEMS, fit, instructions=True)
    assert kept[0]["content"] == [{"type": "input_text", "text": "First question. Long."}]
    assert kept[0]["id"] == ITEMS[0]["id"] and kept[0]["role"] == "user"
    assert kept[1] == {**ITEMS[4], "output": "three."}
    assert kept[2:] == [ITEMS[5], ITEMS[6]]
    assert ITEMS[0]["content"][0]["text"] == "First question.  Long."  # not changed in place


def test_without_instructions_positions_start_at_the_first_item() -> None:
    messages = chat_messages(ITEMS)
    fit = TruncatedChat([], messages[2:], (2, 3, 4), ("drop_turns",))
    assert fitted_items(ITEMS, fit, instructions=False) == ITEMS[4:]


REASONED: list[Item] = identified(
    [
        {"role": "user", "content": "Old question."},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "T"}]},
        {"role": "assistant", "content": "Old  answer. Long."},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "out"},
        {"role": "user", "content": "New question?"},
    ]
)


def test_a_turns_reasoning_is_grouped_with_its_text_and_calls() -> None:
    messages = chat_messages(REASONED, "Be brief.")
    assert message_groups(REASONED, True) == [[], [0], [1, 2, 3], [4], [5]]
    assert len(message_groups(REASONED, True)) == len(messages)
    assert messages[2]["reasoning"] == "T" and messages[2]["content"] == "Old  answer. Long."


def test_a_fitted_turn_keeps_its_reasoning_and_its_text_as_cut() -> None:
    messages = chat_messages(REASONED, "Be brief.")
    cut = {**messages[2], "content": "Long."}
    fit = TruncatedChat([], [messages[0], cut, *messages[3:]], (0, 2, 3, 4), ("cut_turn",))
    kept = fitted_items(REASONED, fit, instructions=True)
    assert kept[0] == REASONED[1]  # the reasoning item, untouched
    assert kept[1] == {**REASONED[2], "content": [{"type": "output_text", "text": "Long."}]}
    assert kept[2:] == REASONED[3:]
    dropped = TruncatedChat([], [messages[0], *messages[3:]], (0, 3, 4), ("drop_turns",))
    assert fitted_items(REASONED, dropped, instructions=True) == REASONED[4:]

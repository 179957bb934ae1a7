"""The conversation a truncated Responses run used, as the items a stored response keeps.

With `truncation: "auto"` the chat the request became may lose older messages, and keep
others cut or with their whitespace collapsed (`inference.truncation`). The prompt, and so
the charge, is that fitted chat; the stored conversation is the same, so that continuing it
sends what the model saw (not the whole input again, to be fitted again, stored in full again).
"""

from __future__ import annotations

from typing import Any

from sluicegate.inference.truncation import TruncatedChat
from sluicegate.wire.responses import Item


def fitted_items(items: list[Item], truncated: TruncatedChat, instructions: bool) -> list[Item]:
    """The `items` (the conversation, each already with its id) that `truncated` kept, with
    their texts as it left them; `instructions`: the chat starts with them (never stored)."""
    groups = message_groups(items, instructions)
    kept: list[Item] = []
    for position, message in zip(truncated.kept, truncated.messages, strict=True):
        group = groups[position]
        if not group:  # the instructions
            continue
        first = items[group[0]]
        content, original = message.get("content"), _text_of(first)
        if isinstance(content, str) and original is not None and content != original:
            kept.append(_with_text(first, content))
            kept += (items[i] for i in group[1:])
        else:
            kept += (items[i] for i in group)
    return kept


def message_groups(items: list[Item], instructions: bool) -> list[list[int]]:
    """For each chat message `wire.responses.chat_messages` makes of `items`, the positions of
    the items it came from (none for the instructions): a run of function calls joins the
    assistant message before it; every other item is a message of its own."""
    groups: list[list[int]] = [[]] if instructions else []
    assistant = False
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "function_call" and assistant:
            groups[-1].append(i)
            continue
        groups.append([i])
        assistant = kind == "function_call" or (
            kind == "message" and item.get("role") == "assistant"
        )
    return groups


def _text_of(item: Item) -> str | None:
    """The text the item's chat message holds (None: a function call, whose message has no
    text of its own)."""
    kind = item.get("type", "message")
    value: Any = item.get("content") if kind == "message" else item.get("output")
    if kind == "function_call" or value is None:
        return None
    return value if isinstance(value, str) else "".join(p["text"] for p in value)


def _with_text(item: Item, text: str) -> Item:
    if item.get("type", "message") == "function_call_output":
        return {**item, "output": text}
    content = item.get("content")
    part = content[0]["type"] if isinstance(content, list) and content else "input_text"
    return {**item, "content": [{"type": part, "text": text}]}

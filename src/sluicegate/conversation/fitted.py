"""The conversation a truncated Responses run used, as the items a stored response keeps.

With `truncation: "auto"` the chat the request became may lose older messages, and keep
others cut or with their whitespace collapsed (`inference.truncation`). The prompt, and so
the charge, is that fitted chat; the stored conversation is the same, so that continuing it
sends what the model saw (not the whole input again, to be fitted again, stored in full again).
"""

from __future__ import annotations

from typing import Any

from sluicegate.inference.truncation import TruncatedChat
from sluicegate.wire.response_items import Item, chat_groups


def fitted_items(items: list[Item], truncated: TruncatedChat, instructions: bool) -> list[Item]:
    """The `items` (the conversation, each already with its id) that `truncated` kept, with
    their texts as it left them; `instructions`: the chat starts with them (never stored)."""
    groups = message_groups(items, instructions)
    kept: list[Item] = []
    for position, message in zip(truncated.kept, truncated.messages, strict=True):
        content = message.get("content")
        for i in groups[position]:  # none for the instructions
            item, original = items[i], _text_of(items[i])
            if isinstance(content, str) and original is not None and content != original:
                item = _with_text(item, content)
            kept.append(item)
    return kept


def message_groups(items: list[Item], instructions: bool) -> list[list[int]]:
    """For each chat message `wire.response_items.chat_messages` makes of `items`, the
    positions of the items it came from (none for the instructions): an assistant turn's
    reasoning, text and function calls together (`chat_groups`); every other item is a
    message of its own."""
    return [[], *chat_groups(items)] if instructions else chat_groups(items)


def _text_of(item: Item) -> str | None:
    """The text the item gives its chat message (None: a function call or a reasoning item,
    which give it none; a message has at most one item that does)."""
    kind = item.get("type", "message")
    if kind not in ("message", "function_call_output"):
        return None
    value: Any = item.get("content") if kind == "message" else item.get("output")
    if value is None:
        return None
    return value if isinstance(value, str) else "".join(p["text"] for p in value if "text" in p)


def _with_text(item: Item, text: str) -> Item:
    if item.get("type", "message") == "function_call_output":
        return {**item, "output": text}
    content = item.get("content")
    part = content[0]["type"] if isinstance(content, list) and content else "input_text"
    return {**item, "content": [{"type": part, "text": text}]}

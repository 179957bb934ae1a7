"""The items of a Responses conversation: checked as they come in `input`, and turned into the
chat messages the request runs as.

An assistant turn is several items in the Responses API (its reasoning, its text, its function
calls) and one chat message: `chat_groups` says which items make each message, as vLLM's
server groups them, and `conversation.fitted` maps a truncated chat back to items with it.
A reasoning item's text is its `content` (or its `summary`); one sent back sealed
(`encrypted_content`) is `opened` first, with the gateway's seal.
"""

from __future__ import annotations

from typing import Any

from sluicegate.errors import InvalidRequestError
from sluicegate.wire.reasoning_seal import ReasoningSeal, SealError
from sluicegate.wire.requests import IMAGE_DETAILS

Item = dict[str, Any]
"""An input or output item, as JSON (messages, function calls and their outputs, reasoning)."""

_ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = ("input_text", "output_text")
_OUTPUT_FIELDS = ("type", "call_id", "output", "id", "status")
_PART_FIELDS = ("type", "text")
_STATUSES = ("in_progress", "completed", "incomplete")
_REASONING_PARTS = (("summary", "summary_text"), ("content", "reasoning_text"))


class InvalidItem(ValueError):
    """An input item this server cannot take; the message names where."""


def check_item(item: Any, index: int) -> Item:
    """The item, checked: a message (its content a string or text parts, and in a user
    message `input_image` parts), a function call, a function call's output or a reasoning
    item. Anything else (files, built-in tool calls, item references) is refused."""
    where = f"input[{index}]"
    if not isinstance(item, dict):
        raise InvalidItem(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in _ROLES:
            raise InvalidItem(f"{where}.role must be one of {', '.join(_ROLES)}")
        content = item.get("content")
        if isinstance(content, str):
            return item
        if not isinstance(content, list):
            raise InvalidItem(f"{where}.content must be a string or a list of text parts")
        for j, part in enumerate(content):
            part_type = part.get("type") if isinstance(part, dict) else None
            if part_type == "input_image" and isinstance(part, dict):
                _check_image(part, item["role"], f"{where}.content[{j}]")
                continue
            if part_type not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise InvalidItem(
                    f"{where}.content[{j}]: only input_text and output_text parts are "
                    f"supported; {part_type!r} inputs are not supported by this server"
                )
        return item
    if kind == "function_call":
        for name in ("call_id", "name", "arguments"):
            if not isinstance(item.get(name), str):
                raise InvalidItem(f"{where}.{name} must be a string")
        return item
    if kind == "function_call_output":
        _only_fields(item, _OUTPUT_FIELDS, where, "a function_call_output item")
        if not isinstance(item.get("call_id"), str):
            raise InvalidItem(f"{where}.call_id must be a string")
        if not isinstance(item.get("id", ""), str):
            raise InvalidItem(f"{where}.id must be a string")
        if item.get("status", "completed") not in _STATUSES:
            raise InvalidItem(f"{where}.status must be one of {', '.join(_STATUSES)}")
        output = item.get("output")
        if not isinstance(output, str | list):
            raise InvalidItem(f"{where}.output must be a string or a list of text parts")
        for j, part in enumerate(output if isinstance(output, list) else ()):
            part_where = f"{where}.output[{j}]"
            if (
                not isinstance(part, dict)
                or part.get("type", "input_text") not in _TEXT_PARTS
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidItem(f"{part_where}: only input_text parts are supported")
            _only_fields(part, _PART_FIELDS, part_where, "a text part")
        return item
    if kind == "reasoning":
        _check_reasoning(item, where)
        return item
    raise InvalidItem(f"{where}: items of type {kind!r} are not supported by this server")


def _check_image(part: dict[str, Any], role: str, where: str) -> None:
    """An `input_image` part: in a user message, its `image_url` (an http(s) URL or a `data:`
    URI) and `detail`; a `file_id` (the Files API, which this server has not) is refused."""
    if role != "user":
        raise InvalidItem(f"{where}: images are read in user messages only")
    if part.get("file_id") is not None:
        raise InvalidItem(f"{where}.file_id: files are not supported here (send image_url)")
    if not isinstance(part.get("image_url"), str):
        raise InvalidItem(f"{where}.image_url must be a string (a URL or a data: URI)")
    if part.get("detail", "auto") not in IMAGE_DETAILS:
        raise InvalidItem(f"{where}.detail must be one of {', '.join(IMAGE_DETAILS)}")


def images_of(item: Item) -> list[tuple[int, dict[str, Any]]]:
    """A message item's `input_image` parts, with their positions."""
    content = item.get("content")
    if item.get("type", "message") != "message" or not isinstance(content, list):
        return []
    return [(j, part) for j, part in enumerate(content) if part.get("type") == "input_image"]


def _check_reasoning(item: Item, where: str) -> None:
    """A reasoning item as OpenAI's SDKs send it back: `summary` and `content` lists of text
    parts (either may be null or absent, as the Agents SDK sends them), `encrypted_content`
    and `status` null or set."""
    for name, part_type in _REASONING_PARTS:
        parts = item.get(name)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise InvalidItem(f"{where}.{name} must be a list of {part_type} parts")
        for j, part in enumerate(parts):
            if (
                not isinstance(part, dict)
                or part.get("type") != part_type
                or not isinstance(part.get("text"), str)
            ):
                raise InvalidItem(
                    f"{where}.{name}[{j}] must be a {part_type} part (its type and text)"
                )
    if not isinstance(item.get("encrypted_content") or "", str):
        raise InvalidItem(f"{where}.encrypted_content must be a string")
    if item.get("status") not in (None, *_STATUSES):
        raise InvalidItem(f"{where}.status must be one of {', '.join(_STATUSES)}")


def _only_fields(value: dict[str, Any], known: tuple[str, ...], where: str, what: str) -> None:
    # Refused rather than dropped: a field this server does not know may carry meaning the
    # client expects kept, and what is not checked is not stored (`identified`).
    for name in value:
        if name not in known:
            raise InvalidItem(
                f"{where}.{name} is not a field of {what} (its fields: {', '.join(known)})"
            )


def item_texts(item: Item) -> list[str]:
    texts: list[str] = []
    fields = ("content", "output", "arguments", "name", "call_id", "summary")
    for value in (item.get(field) for field in fields):
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, list):
            texts += [p["text"] for p in value if "text" in p]
    return texts


def _text(content: str | list[dict[str, Any]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p["text"] for p in content if "text" in p)


def _user_content(content: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's content as the chat takes it: its text, or with images, its parts."""
    if isinstance(content, str) or not any(p["type"] == "input_image" for p in content):
        return _text(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if part["type"] != "input_image":
            parts.append({"type": "text", "text": part["text"]})
            continue
        image = {"url": part["image_url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        parts.append({"type": "image_url", "image_url": image})
    return parts


def chat_groups(items: list[Item]) -> list[list[int]]:
    """The positions of the items each chat message is made of (`chat_messages`). As vLLM's
    server: a function call joins the assistant turn before it, a reasoning item one that has
    no reasoning yet, an assistant message one that has no text yet (one its reasoning or its
    calls began); every other item begins a message of its own."""
    groups: list[list[int]] = []
    assistant = reasoned = texted = False
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        said = kind == "message" and item.get("role") == "assistant"
        if assistant and (
            kind == "function_call"
            or (kind == "reasoning" and not reasoned)
            or (said and not texted)
        ):
            groups[-1].append(i)
        else:
            groups.append([i])
            assistant = said or kind in ("function_call", "reasoning")
            reasoned = texted = False
        reasoned = reasoned or kind == "reasoning"
        texted = texted or kind == "message"
    return groups


def chat_messages(items: list[Item], instructions: str | None = None) -> list[dict[str, Any]]:
    """The conversation as chat messages: `instructions` first (a system message), then one
    message per group of items (`chat_groups`): an assistant turn with its text, its
    reasoning (`reasoning_of`) and its function calls as `tool_calls`; a function call's
    output as a `tool` message; other messages as they are."""
    messages: list[dict[str, Any]] = []
    if instructions is not None:
        messages.append({"role": "system", "content": instructions})
    for group in chat_groups(items):
        first = items[group[0]]
        kind = first.get("type", "message")
        if kind == "function_call_output":
            text = _text(first["output"])
            messages.append({"role": "tool", "tool_call_id": first["call_id"], "content": text})
        elif kind == "message" and first["role"] != "assistant":
            messages.append({"role": first["role"], "content": _user_content(first["content"])})
        else:
            messages.append(_assistant_turn([items[i] for i in group]))
    return messages


def _assistant_turn(items: list[Item]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None}
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            message["content"] = _text(item["content"])
        elif kind == "reasoning":
            message["reasoning"] = reasoning_of(item)
        else:
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            message.setdefault("tool_calls", []).append(call)
    return message


def reasoning_of(item: Item) -> str:
    """A reasoning item's text: its `content` parts, else (as vLLM's server, which warns) its
    `summary` parts, one paragraph each. Sealed text is in `content` once `opened`."""
    if item.get("content"):
        return "".join(p["text"] for p in item["content"])
    return "\n\n".join(p["text"] for p in item.get("summary") or ())


def reasoning_text(text: str) -> dict[str, Any]:
    """A reasoning item's content part."""
    return {"type": "reasoning_text", "text": text}


def opened(items: list[Item], seal: ReasoningSeal) -> list[Item]:
    """The items with each reasoning item's `encrypted_content` opened into its `content`
    (the text the gateway sealed wins over any `content` sent beside it); `items` itself when
    none is sealed. One this gateway did not seal, or sealed under a key it no longer holds,
    is a 400 naming where it is (`input[i].encrypted_content`)."""
    found: list[Item] | None = None
    for i, item in enumerate(items):
        sealed = item.get("encrypted_content") if item.get("type") == "reasoning" else None
        if not sealed:
            continue
        try:
            text = seal.open(sealed)
        except SealError:
            raise InvalidRequestError(
                f"The encrypted_content of input[{i}] was not made by this server, or under a "
                "key it no longer holds: send reasoning items back as this server returned "
                "them.",
                param=f"input[{i}].encrypted_content",
                code="invalid_encrypted_content",
            ) from None
        found = [*items] if found is None else found
        found[i] = {**item, "content": [reasoning_text(text)], "encrypted_content": None}
    return items if found is None else found

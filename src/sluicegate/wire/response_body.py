"""The pieces of the Responses API's response object: ids, output items, usage, and the
envelope that echoes the request's parameters (`ResponseEnvelope`).

A run that reasoned answers with a `reasoning` item first, its thoughts as one `reasoning_text`
part and no summary (as vLLM's server); with `include: ["reasoning.encrypted_content"]` the
item also carries them sealed (`encrypted_content`), for a client that keeps no state to
send back on its next turn."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sluicegate.wire.completion import Usage
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.response_items import Item, reasoning_text


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def new_item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": usage.get("completion_tokens_details", {}).get(
                "reasoning_tokens", 0
            )
        },
        "total_tokens": usage["total_tokens"],
    }


def message_item(item_id: str, text: str, status: str = "completed") -> Item:
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [output_text(text)],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call: dict[str, Any], status: str = "completed") -> Item:
    function = call.get("function") or {}
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call.get("id") or new_item_id("call"),
        "name": function.get("name", ""),
        "arguments": function.get("arguments", ""),
        "status": status,
    }


def reasoning_item(
    item_id: str, text: str, status: str = "completed", seal: ReasoningSeal | None = None
) -> Item:
    """A reasoning item holding `text`; sealed too (`encrypted_content`) when given a seal."""
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [reasoning_text(text)],
        "encrypted_content": None if seal is None else seal.seal(text),
        "status": status,
    }


def output_items(
    message: dict[str, Any], incomplete: bool, seal: ReasoningSeal | None = None
) -> list[Item]:
    """A chat message as output items: its reasoning as a reasoning item (`seal`: sealed
    too), its text as a message item (when it has text, or nothing else), then one function
    call item per tool call. When the output was cut short the last item, the one being
    written, is `incomplete` (as its stream's events say)."""
    thought = message.get("reasoning")
    content = message.get("content")
    calls = message.get("tool_calls") or []
    items: list[Item] = []
    if thought:
        items.append(reasoning_item(new_item_id("rs"), thought, seal=seal))
    if content or not (calls or thought):
        items.append(message_item(new_item_id("msg"), content or "", "completed"))
    items += [function_call_item(new_item_id("fc"), call) for call in calls]
    if incomplete:
        items[-1]["status"] = "incomplete"
    return items


class ResponseEnvelope:
    """The response object's fixed part: id, model, creation time and the echoed request."""

    def __init__(
        self,
        model: str,
        echo: dict[str, Any],
        response_id: str | None = None,
        seal: ReasoningSeal | None = None,
    ):
        self.id = response_id or new_response_id()
        self.created_at = int(time.time())
        self.model = model
        self.echo = echo
        self.seal = seal
        """Seals the reasoning items' text (`include: ["reasoning.encrypted_content"]`);
        None: they carry none."""

    def body(
        self,
        status: str,
        output: list[Item],
        usage: dict[str, Any] | None,
        finish_reason: str | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = status == "incomplete"
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.echo,
        }


_ITEM_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


_ITEM_FIELDS = {
    "message": ("role",),
    "function_call": ("call_id", "name", "arguments"),
    "function_call_output": ("call_id", "output"),
}
"""What is kept of each input item beside its type and content: the fields the conversation
needs, all of them checked text (anything else a client sends is dropped, never stored)."""


def _stored_part(part: dict[str, Any]) -> dict[str, Any]:
    """A message's part as stored: its text, or an image as it came (by URL, or inline: a
    continuation reads it again)."""
    if part["type"] == "input_image":
        return {
            "type": "input_image",
            "image_url": part["image_url"],
            "detail": part.get("detail", "auto"),
        }
    return {"type": part["type"], "text": part["text"]}


def identified(items: list[Item]) -> list[Item]:
    """Input items as they are stored and listed: each with a new id, a message's content as
    text parts (`input_text`, or `output_text` for the assistant's), a reasoning item's text
    as it was used (its sealed text opened already, `ResponsesRequest.opened`), only known
    fields."""
    out = []
    for item in items:
        kind = item.get("type", "message")
        stored: Item = {"id": new_item_id(_ITEM_PREFIXES.get(kind, "item")), "type": kind}
        stored.update((k, item[k]) for k in _ITEM_FIELDS.get(kind, ()) if k in item)
        if kind == "message":
            stored["status"] = "completed"
            content = item["content"]
            if isinstance(content, str):
                part = "output_text" if item["role"] == "assistant" else "input_text"
                stored["content"] = [{"type": part, "text": content}]
            else:
                stored["content"] = [_stored_part(c) for c in content]
        elif kind == "function_call_output" and isinstance(item["output"], list):
            parts = item["output"]
            stored["output"] = [
                {"type": p.get("type", "input_text"), "text": p["text"]} for p in parts
            ]
        elif kind == "reasoning":
            stored["summary"] = [
                {"type": "summary_text", "text": p["text"]} for p in item.get("summary") or ()
            ]
            stored["content"] = [reasoning_text(p["text"]) for p in item.get("content") or ()]
            stored["encrypted_content"] = None
            stored["status"] = "completed"
        out.append(stored)
    return out


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason == "length" else "completed"

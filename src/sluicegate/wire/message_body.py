"""The pieces of Anthropic's message object: content blocks from a chat message (its thoughts
a signed `thinking` block), the stop reason from a finish reason, usage, ids."""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from sluicegate.wire.completion import Completion
from sluicegate.wire.reasoning_seal import ReasoningSeal

logger = logging.getLogger(__name__)


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def stop_reason_of(
    finish_reason: str | None, stop_sequence: str | None, tool_use: bool
) -> str | None:
    """Anthropic's `stop_reason` for the chat format's finish reason."""
    if finish_reason is None:
        return None
    if finish_reason == "length":
        return "max_tokens"
    if tool_use or finish_reason == "tool_calls":
        return "tool_use"
    if stop_sequence is not None:
        return "stop_sequence"
    return "end_turn"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as the object a `tool_use` block's `input` is. Calls whose arguments
    were constrained always parse; text a tool parser read as a call may not (then `{}`)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        logger.info("tool call arguments that are not JSON were sent as {}")
        return {}
    return value if isinstance(value, dict) else {}


def thinking_block(text: str, signature: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": signature}


def content_blocks(message: dict[str, Any], seal: ReasoningSeal) -> list[dict[str, Any]]:
    """A chat message's thoughts (a `thinking` block signed by `seal`), text and tool calls as
    Anthropic content blocks."""
    blocks: list[dict[str, Any]] = []
    thought = message.get("reasoning")
    if thought:
        blocks.append(thinking_block(thought, seal.sign(thought)))
    text = message.get("content")
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": function["name"],
                "input": tool_input(function.get("arguments") or ""),
            }
        )
    return blocks or [{"type": "text", "text": ""}]


def message_usage(prompt_tokens: int, output_tokens: int, cached: bool) -> dict[str, int]:
    """Usage as Anthropic reports it: an answer from the response cache read its whole input
    from the cache (`cache_read_input_tokens`), and Anthropic's `input_tokens` leaves those
    out."""
    return {
        "input_tokens": 0 if cached else prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": prompt_tokens if cached else 0,
    }


@dataclass(slots=True)
class MessageEnvelope:
    """What every rendering of one message shares: its id and model, the seal that signs its
    thoughts; whether it came from the response cache."""

    model: str
    seal: ReasoningSeal
    id: str = ""
    cached: bool = False

    def __post_init__(self) -> None:
        self.id = self.id or new_message_id()

    def body(
        self,
        content: list[dict[str, Any]],
        stop_reason: str | None,
        stop_sequence: str | None,
        usage: dict[str, int],
    ) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": stop_sequence,
            "usage": usage,
        }

    def usage(self, completion: Completion) -> dict[str, int]:
        return message_usage(completion.prompt_tokens, completion.completion_tokens, self.cached)

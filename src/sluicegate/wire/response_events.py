"""The Responses API's stream: named SSE events, numbered, translated from chat chunks.

`ResponseEventWriter` drives the run's chat format like a chat stream does (`EventWriter`)
and turns each chat chunk into Responses events:

    response.created, response.in_progress                   once, before anything else
    a text delta          -> (output_item.added, content_part.added,) output_text.delta
    a tool call delta     -> (output_item.added,) function_call_arguments.delta
    the end               -> output_text.done, content_part.done, output_item.done (per item;
                             function_call_arguments.done for calls), then response.completed
                             (response.incomplete when max_output_tokens cut it short)

A failure after the first byte ends the stream with an `error` event and `response.failed`
(`error`); the stream has no `[DONE]`. Every event carries its `type` and `sequence_number`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import GatewayError
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import EventWriter
from sluicegate.wire.formats import ResponseFormat
from sluicegate.wire.response_body import (
    ResponseEnvelope,
    function_call_item,
    message_item,
    new_item_id,
    output_text,
    response_usage,
    status_of,
)
from sluicegate.wire.responses import Item


def named_event(data: dict[str, Any]) -> bytes:
    """One SSE event named by its `type`."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


class _OpenItem:
    """An output item still streaming: a message's text or a call's arguments so far."""

    def __init__(self, index: int, item: Item) -> None:
        self.index = index
        self.item = item
        self.parts: list[str] = []

    @property
    def id(self) -> str:
        return str(self.item["id"])

    @property
    def is_message(self) -> bool:
        return bool(self.item["type"] == "message")

    def finished(self, status: str) -> Item:
        text = "".join(self.parts)
        if self.is_message:
            return message_item(self.id, text, status)
        call = {
            "id": self.item["call_id"],
            "function": {"name": self.item["name"], "arguments": text},
        }
        return function_call_item(self.id, call, status)


class ResponseEventWriter:
    """The Responses events of one response (see the module doc). `on_completed` gets the
    final response object, before the event that carries it is sent."""

    def __init__(
        self,
        chat: ResponseFormat,
        envelope: ResponseEnvelope,
        on_completed: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self._chunks = EventWriter(chat)
        self._envelope = envelope
        self._on_completed = on_completed
        self._sequence = 0
        self._started = False
        self._items: list[Item] = []
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}
        self._finish_reason: str | None = None

    # ---- the StreamWriter interface (`wire.events`) ------------------------------------

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        yield from self._start()
        for chunk in self._chunks.chunks(delta):
            for choice in chunk.get("choices") or []:
                yield from self._choice(choice)

    def completion(self, prompt_tokens: int) -> Completion:
        return self._chunks.completion(prompt_tokens)

    def closing(self, completion: Completion, include_usage: bool) -> Iterator[bytes]:
        yield from self._start()
        status = status_of(self._finish_reason)
        if self._open is None and not self._items:
            yield from self._open_message()  # no output at all: one empty message
        yield from self._close_open(status)
        response = self._envelope.body(status, self._items, response_usage(completion.usage))
        if self._on_completed is not None:
            self._on_completed(response)
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        yield self._event({"type": kind, "response": response})

    def done(self) -> bytes:
        return b""

    def error(self, error: GatewayError) -> bytes:
        """The events that end a stream failing after its first byte."""
        failed = {"code": error.code or error.error_type, "message": error.message}
        output = [*self._items]
        if self._open is not None:
            output.append(self._open.finished("incomplete"))
        response = self._envelope.body("failed", output, None, error=failed)
        detail = {"type": "error", "code": failed["code"], "message": error.message}
        return self._event({**detail, "param": error.param}) + self._event(
            {"type": "response.failed", "response": response}
        )

    # ---- translating chat chunks -------------------------------------------------------

    def _event(self, data: dict[str, Any]) -> bytes:
        data["sequence_number"] = self._sequence
        self._sequence += 1
        return named_event(data)

    def _start(self) -> Iterator[bytes]:
        if self._started:
            return
        self._started = True
        response = self._envelope.body("in_progress", [], None)
        yield self._event({"type": "response.created", "response": response})
        yield self._event({"type": "response.in_progress", "response": response})

    def _choice(self, choice: dict[str, Any]) -> Iterator[bytes]:
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if text:
            if self._open is None or not self._open.is_message:
                yield from self._close_open("completed")
                yield from self._open_message()
            assert self._open is not None
            self._open.parts.append(text)
            yield self._event(
                {
                    "type": "response.output_text.delta",
                    "item_id": self._open.id,
                    "output_index": self._open.index,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                }
            )
        for call in delta.get("tool_calls") or []:
            yield from self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]

    def _call_delta(self, call: dict[str, Any]) -> Iterator[bytes]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        item = self._calls.get(index)
        if item is None:
            yield from self._close_open("completed")
            added = {
                "id": new_item_id("fc"),
                "type": "function_call",
                "call_id": call.get("id") or new_item_id("call"),
                "name": function.get("name", ""),
                "arguments": "",
                "status": "in_progress",
            }
            item = self._calls[index] = self._open = _OpenItem(len(self._items), added)
            yield self._event(
                {"type": "response.output_item.added", "output_index": item.index, "item": added}
            )
        arguments = function.get("arguments")
        if arguments:
            item.parts.append(arguments)
            yield self._event(
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item.id,
                    "output_index": item.index,
                    "delta": arguments,
                }
            )

    def _open_message(self) -> Iterator[bytes]:
        added = {
            "id": new_item_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        item = self._open = _OpenItem(len(self._items), added)
        yield self._event(
            {"type": "response.output_item.added", "output_index": item.index, "item": added}
        )
        yield self._event(
            {
                "type": "response.content_part.added",
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "part": output_text(""),
            }
        )

    def _close_open(self, status: str) -> Iterator[bytes]:
        item = self._open
        if item is None:
            return
        self._open = None
        finished = item.finished(status)
        place = {"item_id": item.id, "output_index": item.index}
        if item.is_message:
            text = finished["content"][0]["text"]
            yield self._event(
                {
                    "type": "response.output_text.done",
                    **place,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            )
            yield self._event(
                {
                    "type": "response.content_part.done",
                    **place,
                    "content_index": 0,
                    "part": output_text(text),
                }
            )
        else:
            yield self._event(
                {
                    "type": "response.function_call_arguments.done",
                    **place,
                    "name": finished["name"],
                    "arguments": finished["arguments"],
                }
            )
        yield self._event(
            {"type": "response.output_item.done", "output_index": item.index, "item": finished}
        )
        self._items.append(finished)

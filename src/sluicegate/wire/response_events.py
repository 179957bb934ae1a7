"""The Responses API's stream: named SSE events, numbered, translated from chat chunks.

`ResponseEventWriter` drives the run's chat format like a chat stream does (`EventWriter`)
and turns each chat chunk into Responses events:

    response.created, response.in_progress                   once, before anything else
    a reasoning delta     -> (output_item.added, content_part.added,) reasoning_text.delta
    a text delta          -> (output_item.added, content_part.added,) output_text.delta
    a tool call delta     -> (output_item.added,) function_call_arguments.delta
    the end               -> output_text.done, content_part.done, output_item.done (per item;
                             reasoning_text.done for reasoning, function_call_arguments.done
                             for calls), then response.completed (response.incomplete when
                             max_output_tokens cut it short)

An item ends when the next begins: the reasoning item (which comes first, as the chat format
writes the thoughts first) is done before the message's first event, as vLLM's server sends
them. A chunk carrying both thoughts and text makes the reasoning events first.

A failure after the first byte ends the stream with an `error` event and `response.failed`
(`error`); the stream has no `[DONE]`. Every event carries its `type` and `sequence_number`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import GatewayError
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import SSE_KEEPALIVE, EventWriter
from sluicegate.wire.formats import ResponseFormat
from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.response_body import (
    ResponseEnvelope,
    function_call_item,
    message_item,
    new_item_id,
    output_text,
    reasoning_item,
    response_usage,
    status_of,
)
from sluicegate.wire.response_items import Item, reasoning_text


def named_event(data: dict[str, Any]) -> bytes:
    """One SSE event named by its `type`."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


class _OpenItem:
    """An output item still streaming: a message's text, the thoughts or a call's arguments
    so far."""

    def __init__(self, index: int, item: Item) -> None:
        self.index = index
        self.item = item
        self.parts: list[str] = []

    @property
    def id(self) -> str:
        return str(self.item["id"])

    @property
    def kind(self) -> str:
        return str(self.item["type"])

    def finished(self, status: str, seal: ReasoningSeal | None) -> Item:
        text = "".join(self.parts)
        if self.kind == "message":
            return message_item(self.id, text, status)
        if self.kind == "reasoning":
            return reasoning_item(self.id, text, status, seal)
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
            output.append(self._open.finished("incomplete", self._envelope.seal))
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
        thought = delta.get("reasoning")
        if thought:
            yield from self._text_delta("reasoning", "response.reasoning_text.delta", thought)
        text = delta.get("content")
        if text:
            yield from self._text_delta("message", "response.output_text.delta", text, logprobs=[])
        for call in delta.get("tool_calls") or []:
            yield from self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]

    def _text_delta(self, kind: str, event: str, text: str, **extra: Any) -> Iterator[bytes]:
        """`text` added to the open item of `kind` (opened first if another is open)."""
        item = yield from self._opened(kind)
        item.parts.append(text)
        yield self._event(
            {
                "type": event,
                "item_id": item.id,
                "output_index": item.index,
                "content_index": 0,
                "delta": text,
                **extra,
            }
        )

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

    def _opened(self, kind: str) -> Generator[bytes, None, _OpenItem]:
        """The open item of `kind` (a message or the reasoning), the one open before closed
        and this one added when it is of another kind."""
        if self._open is None or self._open.kind != kind:
            yield from self._close_open("completed")
            if kind == "reasoning":
                yield from self._open_reasoning()
            else:
                yield from self._open_message()
        assert self._open is not None
        return self._open

    def _open_message(self) -> Iterator[bytes]:
        added = {
            "id": new_item_id("msg"),
            "type": "message",
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }
        yield from self._added(added, output_text(""))

    def _open_reasoning(self) -> Iterator[bytes]:
        added: Item = {
            "id": new_item_id("rs"),
            "type": "reasoning",
            "summary": [],
            "content": [],
            "encrypted_content": None,
            "status": "in_progress",
        }
        yield from self._added(added, reasoning_text(""))

    def _added(self, added: Item, part: dict[str, Any]) -> Iterator[bytes]:
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
                "part": part,
            }
        )

    def _close_open(self, status: str) -> Iterator[bytes]:
        item = self._open
        if item is None:
            return
        self._open = None
        finished = item.finished(status, self._envelope.seal)
        place = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "message":
            part = finished["content"][0]
            yield self._event(
                {
                    "type": "response.output_text.done",
                    **place,
                    "text": part["text"],
                    "logprobs": [],
                }
            )
            yield self._event({"type": "response.content_part.done", **place, "part": part})
        elif item.kind == "reasoning":
            part = finished["content"][0]
            yield self._event(
                {"type": "response.reasoning_text.done", **place, "text": part["text"]}
            )
            yield self._event({"type": "response.content_part.done", **place, "part": part})
        else:
            yield self._event(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item.id,
                    "output_index": item.index,
                    "name": finished["name"],
                    "arguments": finished["arguments"],
                }
            )
        yield self._event(
            {"type": "response.output_item.done", "output_index": item.index, "item": finished}
        )
        self._items.append(finished)

    # ---- keeping a silent stream alive (`http.sse`) --------------------------------------

    def ping(self) -> bytes:
        """A comment, not an event: it takes no sequence number."""
        return SSE_KEEPALIVE

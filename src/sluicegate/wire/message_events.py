"""Anthropic's Messages stream: named SSE events, translated from chat chunks.

`MessageEventWriter` drives the run's chat format like a chat stream does (`EventWriter`) and
turns each chat chunk into Anthropic's events:

    message_start                              once, before anything else (with the input
                                               tokens; `opening`, when the stream begins
                                               before the first token)
    ping                                       while the first token is slow (`http.sse`)
    a thought        -> (content_block_start (thinking),) content_block_delta
                        (thinking_delta)
    a text delta     -> (content_block_stop of the block before,) (content_block_start,)
                        content_block_delta (text_delta)
    a tool call      -> (content_block_stop of the block before,) content_block_start
                        (tool_use), content_block_delta (input_json_delta) per fragment
    the end          -> content_block_stop, message_delta (stop_reason, stop_sequence,
                        usage), message_stop

A thinking block ends with a `signature_delta` before its `content_block_stop`: the seal's
signature over a running SHA-256 of its deltas' text, which is the signature of the whole
text (`ReasoningSeal.sign`), so the answer, the stream, a cache hit and a replay sign alike.

A failure after the first byte ends the stream with an `error` event in Anthropic's shape;
the stream has no `[DONE]`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import GatewayError, anthropic_error
from sluicegate.wire.completion import Completion
from sluicegate.wire.events import EventWriter
from sluicegate.wire.formats import ResponseFormat
from sluicegate.wire.message_body import (
    MessageEnvelope,
    message_usage,
    stop_reason_of,
    thinking_block,
)

PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def named_event(data: dict[str, Any]) -> bytes:
    """One SSE event named by its `type`."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {data['type']}\ndata: {payload}\n\n".encode()


class MessageEventWriter:
    """The Messages events of one message (see the module doc)."""

    def __init__(self, chat: ResponseFormat, envelope: MessageEnvelope, prompt_tokens: int):
        self._chunks = EventWriter(chat)
        self._envelope = envelope
        self._prompt_tokens = prompt_tokens
        self._started = False
        self._blocks = 0
        """Content blocks opened so far (the next one's index)."""
        self._open: str | None = None
        """The type of the block still open: `thinking`, `text`, `tool_use`, or None."""
        self._thought = hashlib.sha256()
        """The open thinking block's text so far, digested (`reasoning_seal.text_digest`)."""
        self._calls: dict[int, int] = {}
        """A tool call's index in the chat chunks -> its block's index."""
        self._finish_reason: str | None = None

    # ---- the StreamWriter interface (`wire.events`) ------------------------------------

    def opening(self) -> bytes:
        """`message_start`, for a stream that begins before its first token (then pings)."""
        return b"".join(self._start())

    def ping(self) -> bytes:
        return PING

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        yield from self._start()
        for chunk in self._chunks.chunks(delta):
            for choice in chunk.get("choices") or []:
                yield from self._choice(choice)

    def completion(self, prompt_tokens: int) -> Completion:
        return self._chunks.completion(prompt_tokens)

    def closing(self, completion: Completion, include_usage: bool) -> Iterator[bytes]:
        yield from self._start()
        yield from self._close_open()
        stop_sequence = completion.choices[0].stop_sequence if completion.choices else None
        reason = stop_reason_of(
            self._finish_reason or "stop", stop_sequence, tool_use=bool(self._calls)
        )
        yield named_event(
            {
                "type": "message_delta",
                "delta": {
                    "stop_reason": reason,
                    "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
                },
                "usage": self._envelope.usage(completion),
            }
        )
        yield named_event({"type": "message_stop"})

    def done(self) -> bytes:
        return b""

    def error(self, error: GatewayError) -> bytes:
        """The event that ends a stream failing after its first byte."""
        _, body = anthropic_error(error)
        return named_event(body)

    # ---- translating chat chunks -------------------------------------------------------

    def _start(self) -> Iterator[bytes]:
        if self._started:
            return
        self._started = True
        usage = message_usage(self._prompt_tokens, 0, self._envelope.cached)
        message = self._envelope.body([], None, None, usage)
        yield named_event({"type": "message_start", "message": message})

    def _choice(self, choice: dict[str, Any]) -> Iterator[bytes]:
        delta = choice.get("delta") or {}
        thought = delta.get("reasoning")
        if thought:
            if self._open != "thinking":
                yield from self._close_open()
                yield from self._open_block(thinking_block("", ""), "thinking")
                self._thought = hashlib.sha256()
            self._thought.update(thought.encode("utf-8", "surrogatepass"))
            yield named_event(
                {
                    "type": "content_block_delta",
                    "index": self._blocks - 1,
                    "delta": {"type": "thinking_delta", "thinking": thought},
                }
            )
        text = delta.get("content")
        if text:
            if self._open != "text":
                yield from self._close_open()
                yield from self._open_block({"type": "text", "text": ""}, "text")
            yield named_event(
                {
                    "type": "content_block_delta",
                    "index": self._blocks - 1,
                    "delta": {"type": "text_delta", "text": text},
                }
            )
        for call in delta.get("tool_calls") or []:
            yield from self._call_delta(call)
        if choice.get("finish_reason") is not None:
            self._finish_reason = choice["finish_reason"]

    def _call_delta(self, call: dict[str, Any]) -> Iterator[bytes]:
        index = call.get("index", 0)
        function = call.get("function") or {}
        block = self._calls.get(index)
        if block is None:
            yield from self._close_open()
            opened = {
                "type": "tool_use",
                "id": call.get("id") or "",
                "name": function.get("name", ""),
                "input": {},
            }
            yield from self._open_block(opened, "tool_use")
            block = self._calls[index] = self._blocks - 1
        arguments = function.get("arguments")
        if arguments:
            yield named_event(
                {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": arguments},
                }
            )

    def _open_block(self, block: dict[str, Any], kind: str) -> Iterator[bytes]:
        yield named_event(
            {"type": "content_block_start", "index": self._blocks, "content_block": block}
        )
        self._blocks += 1
        self._open = kind

    def _close_open(self) -> Iterator[bytes]:
        if self._open is None:
            return
        if self._open == "thinking":
            signature = self._envelope.seal.sign_digest(self._thought.digest())
            yield named_event(
                {
                    "type": "content_block_delta",
                    "index": self._blocks - 1,
                    "delta": {"type": "signature_delta", "signature": signature},
                }
            )
        self._open = None
        yield named_event({"type": "content_block_stop", "index": self._blocks - 1})

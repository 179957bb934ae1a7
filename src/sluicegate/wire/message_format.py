"""Anthropic's Messages API format: the message object, rendered from the chat format's.

`MessagesFormat` wraps the chat format of the run the request became, as `ResponsesFormat`
does: the chat format turns a completion into a chat message (thoughts, text, and tool calls
once the chat format makes them), and this turns that message into content blocks
(`thinking`, signed by the envelope's seal; `text`; `tool_use`). Its stream is
`message_events`. Cache hits render through it too, with their input counted as read from the
cache; their thoughts sign as the live answer's did (a signature depends on the text alone).
"""

from __future__ import annotations

from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.completion import ChoiceState, Completion, Usage
from sluicegate.wire.formats import ResponseFormat
from sluicegate.wire.message_body import MessageEnvelope, content_blocks, stop_reason_of
from sluicegate.wire.message_events import MessageEventWriter


class MessagesFormat:
    """A `ResponseFormat` for `POST /v1/messages` over the run's chat format."""

    def __init__(self, chat: ResponseFormat, envelope: MessageEnvelope, prompt_tokens: int):
        self.chat = chat
        self.envelope = envelope
        self.id = envelope.id
        self.prompt_tokens = prompt_tokens
        """The input tokens, which the stream's first event says before any output."""
        self._writer: MessageEventWriter | None = None

    def first_chunk(self, index: int) -> dict[str, Any] | None:
        return self.chat.first_chunk(index)

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        return self.chat.delta_chunks(state, delta)

    def finish_chunks(self, state: ChoiceState) -> list[dict[str, Any]]:
        return self.chat.finish_chunks(state)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.chat.usage_chunk(usage)

    def response(self, completion: Completion) -> dict[str, Any]:
        choice = self.chat.response(completion)["choices"][0]
        blocks = content_blocks(choice["message"], self.envelope.seal)
        tool_use = any(block["type"] == "tool_use" for block in blocks)
        stop_sequence = completion.choices[0].stop_sequence if completion.choices else None
        reason = stop_reason_of(choice.get("finish_reason"), stop_sequence, tool_use)
        sequence = stop_sequence if reason == "stop_sequence" else None
        return self.envelope.body(blocks, reason, sequence, self.envelope.usage(completion))

    def renewed(self) -> MessagesFormat:
        """The same format for another response: its own ids."""
        envelope = MessageEnvelope(self.envelope.model, self.envelope.seal)
        return MessagesFormat(self.chat.renewed(), envelope, self.prompt_tokens)

    def renders_alike(self) -> bool:
        return False  # its message id is its own

    def answered_from_cache(self) -> None:
        """The response cache answers: the input counts as read from it."""
        self.envelope.cached = True

    def stream_writer(self) -> MessageEventWriter:
        """This message's one stream writer (the keep-alive pings and the events share it)."""
        if self._writer is None:
            self._writer = MessageEventWriter(self.chat, self.envelope, self.prompt_tokens)
        return self._writer

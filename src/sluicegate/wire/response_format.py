"""The Responses API's format: the response object, rendered from the chat format's.

`ResponsesFormat` wraps the chat format of the run the request became: the chat format turns
a completion into a chat message (thoughts, text, and tool calls once the chat format makes
them), and this turns that message into Responses output items (a `reasoning` item, a
`message` with `output_text`, `function_call`s). Its stream is `response_events`. Cache hits
render through it too, so they answer identically.
"""

from __future__ import annotations

from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.completion import ChoiceState, Completion, Usage
from sluicegate.wire.formats import ResponseFormat
from sluicegate.wire.response_body import (
    ResponseEnvelope,
    output_items,
    response_usage,
    status_of,
)
from sluicegate.wire.response_events import ResponseEventWriter


class ResponsesFormat:
    """A `ResponseFormat` for `POST /v1/responses` over the run's chat format.

    Its stream is its own (`stream_writer`: Responses events instead of chat chunks); the
    chunk methods hand on the chat format's, which that writer translates."""

    def __init__(self, chat: ResponseFormat, envelope: ResponseEnvelope) -> None:
        self.chat = chat
        self.envelope = envelope
        self.id = envelope.id
        self.final: dict[str, Any] | None = None
        """The response object once rendered whole (a body, or a stream's last event)."""
        self._writer: ResponseEventWriter | None = None

    def first_chunk(self, index: int) -> dict[str, Any] | None:
        return self.chat.first_chunk(index)

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        return self.chat.delta_chunks(state, delta)

    def finish_chunks(self, state: ChoiceState) -> list[dict[str, Any]]:
        return self.chat.finish_chunks(state)

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.chat.usage_chunk(usage)

    def response(self, completion: Completion) -> dict[str, Any]:
        chat = self.chat.response(completion)
        choice = chat["choices"][0]
        status = status_of(choice.get("finish_reason"))
        output = output_items(choice["message"], status == "incomplete", self.envelope.seal)
        self.final = self.envelope.body(status, output, response_usage(completion.usage))
        return self.final

    def renewed(self) -> ResponsesFormat:
        """The same format for another response: its own ids and creation time."""
        old = self.envelope
        envelope = ResponseEnvelope(old.model, old.echo, seal=old.seal)
        return ResponsesFormat(self.chat.renewed(), envelope)

    def renders_alike(self) -> bool:
        return False  # its items have ids of their own

    def stream_writer(self) -> ResponseEventWriter:
        """This response's one stream writer (it numbers the events; `http.sse` asks it for
        the error event after a failure)."""
        if self._writer is None:
            self._writer = ResponseEventWriter(self.chat, self.envelope, self._completed)
        return self._writer

    def _completed(self, response: dict[str, Any]) -> None:
        self.final = response

"""The Responses stream's keep-alive: a comment, outside the numbered events."""

from __future__ import annotations

import json

from openai._streaming import SSEDecoder

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.events import SSE_KEEPALIVE, stream_writer
from sluicegate.wire.formats import chat_format
from sluicegate.wire.response_body import ResponseEnvelope
from sluicegate.wire.response_format import ResponsesFormat
from sluicegate.wire.responses import ResponsesRequest


def test_pings_between_events_take_no_sequence_number_and_clients_skip_them() -> None:
    echo = ResponsesRequest(model="m", input="hi").echo()
    writer = stream_writer(ResponsesFormat(chat_format("m", False), ResponseEnvelope("m", echo)))
    assert writer.ping() == SSE_KEEPALIVE
    first = b"".join(writer.events(ChoiceDelta(0, "Hel", 1, None)))
    last = ChoiceDelta(0, "lo", 1, None)
    last.finish_reason = "stop"
    stream = writer.ping() + first + writer.ping() + b"".join(writer.events(last))
    stream += b"".join(writer.closing(writer.completion(4), False)) + writer.ping()
    events = [json.loads(e.data) for e in SSEDecoder().iter_bytes(iter([stream]))]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"

from __future__ import annotations

import json

from openai._streaming import SSEDecoder

from sluicegate.wire.events import SSE_KEEPALIVE, EventWriter, sse_event
from sluicegate.wire.formats import chat_format


def test_sse_event_is_one_compact_data_line() -> None:
    event = sse_event({"a": "x\ny", "b": [1, 2]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # newlines inside strings are escaped by JSON
    assert json.loads(event[6:]) == {"a": "x\ny", "b": [1, 2]}


def test_sse_event_writes_utf8_and_falls_back_for_what_orjson_refuses() -> None:
    assert sse_event({"content": "café ☕"}) == 'data: {"content":"café ☕"}\n\n'.encode()
    # A lone surrogate (an upstream may send one escaped): written escaped, not refused.
    event = sse_event({"content": "a\ud800"})
    assert event == b'data: {"content":"a\\ud800"}\n\n'
    assert json.loads(event[6:]) == {"content": "a\ud800"}
    assert json.loads(sse_event({1: "int key"})[6:]) == {"1": "int key"}


def test_the_keep_alive_is_a_comment_an_sse_client_skips() -> None:
    ping = EventWriter(chat_format("m", False)).ping()
    assert ping == SSE_KEEPALIVE == b": keep-alive\n\n"
    stream = ping + sse_event({"a": 1}) + ping + ping + b"data: [DONE]\n\n"
    events = list(SSEDecoder().iter_bytes(iter([stream])))
    assert [e.data for e in events] == ['{"a":1}', "[DONE]"]

from __future__ import annotations

import json

from sluicegate.wire.events import sse_event


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

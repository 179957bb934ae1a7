from __future__ import annotations

import json

from sluicegate.wire.events import sse_event


def test_sse_event_is_one_compact_data_line() -> None:
    event = sse_event({"a": "x\ny", "b": [1, 2]})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert event.count(b"\n") == 2  # newlines inside strings are escaped by JSON
    assert json.loads(event[6:]) == {"a": "x\ny", "b": [1, 2]}

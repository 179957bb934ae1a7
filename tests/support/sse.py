"""Reading a server-sent event stream in tests: one parser for every tier."""

from __future__ import annotations

import json
from typing import Any


def sse_data(text: str) -> list[str]:
    """A stream's `data:` payloads in order, as sent (`[DONE]` included)."""
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


def sse_payloads(text: str) -> list[Any]:
    """A stream's `data:` events in order: `[DONE]` as the string, every other one parsed,
    without the fields that differ per response (`id`, `created`), which every chunk must
    have. An error event (no chunk, so neither field) is kept whole."""
    events: list[Any] = []
    for data in sse_data(text):
        if data == "[DONE]":
            events.append(data)
            continue
        event = json.loads(data)
        if isinstance(event, dict) and "error" not in event:
            assert "id" in event and "created" in event, f"a chunk without id or created: {data}"
            del event["id"], event["created"]
        events.append(event)
    return events

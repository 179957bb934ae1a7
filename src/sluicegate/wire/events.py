"""Server-sent events as bytes: framing, the events of a run, and a cached answer.

No I/O here: `http.sse` sends what this builds. `render_cached` is the one rendering of a
cached completion, used by both the fast path (`http.cache_hits`) and the route.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.wire.completion import ChoiceState, Completion, checked_finish
from sluicegate.wire.formats import ResponseFormat

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


def sse_event(data: Mapping[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


class EventWriter:
    """Turns choice deltas into SSE events in a response format. It keeps per choice only what
    the events still need (counts, text length), never the text or logprobs it sent."""

    def __init__(self, fmt: ResponseFormat) -> None:
        self._fmt = fmt
        self._states: dict[int, ChoiceState] = {}

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        """The events for one delta; `delta.index` is the choice's index in the response."""
        fmt, index = self._fmt, delta.index
        state = self._states.get(index)
        if state is None:
            state = self._states[index] = ChoiceState(index, retain=False)
            first = fmt.first_chunk(index)
            if first is not None:
                yield sse_event(first)
        state.add(delta)
        if delta.text or delta.logprobs:
            for chunk in fmt.delta_chunks(state, delta):
                yield sse_event(chunk)
        if delta.finish_reason is not None:
            state.finish_reason = checked_finish(delta.finish_reason)
            for chunk in fmt.finish_chunks(state):
                yield sse_event(chunk)

    def completion(self, prompt_tokens: int) -> Completion:
        """What was sent, as counts: token counts and finish reasons, no text."""
        return Completion([self._states[k] for k in sorted(self._states)], prompt_tokens)

    def usage_event(self, completion: Completion) -> bytes:
        return sse_event(self._fmt.usage_chunk(completion.usage))


def replay_events(fmt: ResponseFormat, completion: Completion, include_usage: bool) -> bytes:
    """The events a stream sent when it produced `completion`, delta for delta, in one piece
    (without `[DONE]`). The stream is complete, so nothing is gained by sending it in parts."""
    writer = EventWriter(fmt)
    events: list[bytes] = []
    for delta in completion.deltas():
        events.extend(writer.events(delta))
    if include_usage:
        events.append(writer.usage_event(completion))
    return b"".join(events)


@dataclass(frozen=True, slots=True)
class RenderedAnswer:
    body: bytes
    headers: dict[str, str]
    """Content type (and length, for JSON)."""


def render_cached(
    fmt: ResponseFormat, completion: Completion, stream: bool, include_usage: bool
) -> RenderedAnswer:
    """A cached completion as the whole response body: the stream it was (with `[DONE]`), or
    the JSON body."""
    if stream:
        body = replay_events(fmt, completion, include_usage) + SSE_DONE
        return RenderedAnswer(body, {"content-type": "text/event-stream", **SSE_HEADERS})
    content = fmt.response(completion)
    body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return RenderedAnswer(
        body, {"content-type": "application/json", "content-length": str(len(body))}
    )

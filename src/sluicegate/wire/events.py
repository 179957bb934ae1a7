"""Server-sent events as bytes: framing, the events of a run, and a cached answer.

No I/O here: `http.sse` sends what this builds. `render_cached` is the one rendering of a
cached completion, used by both the fast path (`http.cache_hits`) and the route.

A stream is written by a `StreamWriter`: `EventWriter` for the chat and text completion
chunks (ended by `[DONE]`), or the writer a format brings itself (`OwnStream`: the Responses
API's named events, `wire.response_events`). `stream_writer` picks it. Each writer has its
keep-alive (`ping`), which `http.sse` sends when the stream has been silent for a while: an SSE
comment on the OpenAI APIs (every SSE client skips it), a `ping` event on Anthropic's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, runtime_checkable

from sluicegate import fast_json
from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.errors import GatewayError
from sluicegate.wire.completion import ChoiceState, Completion, checked_finish
from sluicegate.wire.formats import ResponseFormat

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
SSE_KEEPALIVE = b": keep-alive\n\n"
"""A comment: it keeps a silent connection busy for the proxies in between, and SSE clients
(the openai SDK's among them) skip it."""


def sse_event(data: Mapping[str, Any]) -> bytes:
    """One `data:` event, its JSON compact and in UTF-8 (as vLLM's server writes it)."""
    return b"data: " + fast_json.dumps(data) + b"\n\n"


class StreamWriter(Protocol):
    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        """The events for one delta."""
        ...

    def completion(self, prompt_tokens: int) -> Completion:
        """What was sent, as counts."""
        ...

    def closing(self, completion: Completion, include_usage: bool) -> Iterator[bytes]:
        """The events after the last delta."""
        ...

    def done(self) -> bytes:
        """What ends a stream that went well (`[DONE]`, or nothing)."""
        ...

    def error(self, error: GatewayError) -> bytes:
        """What ends a stream that failed after its first byte."""
        ...

    def ping(self) -> bytes:
        """What a silent stream sends to keep its connection alive (nothing else in it)."""
        ...


@runtime_checkable
class OwnStream(Protocol):
    """A format whose stream is not made of its chunks (the Responses API's)."""

    def stream_writer(self) -> StreamWriter: ...


@runtime_checkable
class Opening(Protocol):
    """A stream writer whose stream, when it begins before its first output, opens with
    events of its own (Anthropic's: `message_start`, then pings), and sooner
    (`STREAM_PING_AFTER`): `http.sse.Keepalive`."""

    def opening(self) -> bytes: ...

    def ping(self) -> bytes: ...


@runtime_checkable
class CacheAware(Protocol):
    """A format whose answer says when it came from the response cache (Anthropic's usage)."""

    def answered_from_cache(self) -> None: ...


def owns_stream(fmt: object) -> TypeGuard[OwnStream]:
    return _implements(fmt, OwnStream)


def opens_early(writer: object) -> TypeGuard[Opening]:
    return _implements(writer, Opening)


def cache_aware(fmt: object) -> TypeGuard[CacheAware]:
    return _implements(fmt, CacheAware)


_IMPLEMENTS: dict[tuple[type, Any], bool] = {}


def _implements(obj: object, protocol: Any) -> bool:
    """`isinstance(obj, protocol)` for a runtime-checkable protocol of methods, answered once
    per class: the check itself walks the protocol's members (microseconds, per request)."""
    key = (type(obj), protocol)
    found = _IMPLEMENTS.get(key)
    if found is None:
        found = _IMPLEMENTS[key] = issubclass(key[0], protocol)
    return found


def stream_writer(fmt: ResponseFormat) -> StreamWriter:
    """The writer of a stream in `fmt`."""
    return fmt.stream_writer() if owns_stream(fmt) else EventWriter(fmt)


class EventWriter:
    """Turns choice deltas into SSE events in a response format. It keeps per choice only what
    the events still need (counts, text length), never the text or logprobs it sent."""

    def __init__(self, fmt: ResponseFormat) -> None:
        self._fmt = fmt
        self._states: dict[int, ChoiceState] = {}

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        """The events for one delta; `delta.index` is the choice's index in the response."""
        for chunk in self.chunks(delta):
            yield sse_event(chunk)

    def chunks(self, delta: ChoiceDelta) -> Iterator[dict[str, Any]]:
        """The format's chunks for one delta, before framing."""
        fmt, index = self._fmt, delta.index
        state = self._states.get(index)
        if state is None:
            first = fmt.first_chunk(index)
            if first is not None:
                yield first
        state = self.account(delta)
        if delta.text or delta.logprobs or delta.reasoning:
            yield from fmt.delta_chunks(state, delta)
        if delta.finish_reason is not None:
            yield from fmt.finish_chunks(state)

    def account(self, delta: ChoiceDelta) -> ChoiceState:
        """Count `delta` into its choice (opened by its first delta) and take its finish
        reason; the choice's state."""
        state = self._states.get(delta.index)
        if state is None:
            state = self._states[delta.index] = ChoiceState(delta.index, retain=False)
        state.add(delta)
        if delta.finish_reason is not None:
            state.finish_reason = checked_finish(delta.finish_reason)
            state.stop_sequence = delta.stop_sequence
        return state

    def completion(self, prompt_tokens: int) -> Completion:
        """What was sent, as counts: token counts and finish reasons, no text."""
        return Completion([self._states[k] for k in sorted(self._states)], prompt_tokens)

    def usage_event(self, completion: Completion) -> bytes:
        return sse_event(self._fmt.usage_chunk(completion.usage))

    def closing(self, completion: Completion, include_usage: bool) -> Iterator[bytes]:
        if include_usage:
            yield self.usage_event(completion)

    def done(self) -> bytes:
        return SSE_DONE

    def error(self, error: GatewayError) -> bytes:
        return error_events(error)

    def ping(self) -> bytes:
        return SSE_KEEPALIVE


def error_events(error: GatewayError) -> bytes:
    """How a chat or completion stream ends after a failure: the error as OpenAI's error
    body, then `[DONE]` (as vLLM's server does)."""
    return sse_event(error.to_body()) + SSE_DONE


def replay_events(fmt: ResponseFormat, completion: Completion, include_usage: bool) -> bytes:
    """The events a stream sent when it produced `completion`, delta for delta, in one piece
    (with its end: `[DONE]` for chat). The stream is complete, so nothing is gained by sending
    it in parts."""
    writer = stream_writer(fmt)
    events: list[bytes] = []
    for delta in completion.deltas():
        events.extend(writer.events(delta))
    events.extend(writer.closing(completion, include_usage))
    events.append(writer.done())
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
    if cache_aware(fmt):
        fmt.answered_from_cache()
    if stream:
        body = replay_events(fmt, completion, include_usage)
        return RenderedAnswer(body, {"content-type": "text/event-stream", **SSE_HEADERS})
    content = fmt.response(completion)
    body = json.dumps(content, ensure_ascii=False, separators=(",", ":")).encode()
    return RenderedAnswer(
        body, {"content-type": "application/json", "content-length": str(len(body))}
    )

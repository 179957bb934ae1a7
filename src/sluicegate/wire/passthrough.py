"""A plain stream's events handed on as the upstream sent them.

A streamed chat or text completion with one choice, no tools and no logprobs, which neither
the response cache nor a flight collects (`Run.plain_stream`), asks its engine for its own
events (`SamplingOptions.pass_through`). An upstream's chunks are then already what the
client gets, but for their envelope: `PassThroughWriter` puts the run's id, creation time
and model name in place of the upstream's by replacing them as text (learnt once, from the
first event), and drops each chunk's `"usage":null` when the client did not ask for the
usage. Nothing else in a chunk is read or rewritten. The usage event, `[DONE]` and error
events are the gateway's own, as on the rendered path; a delta without events (the engine
cannot pass them on) is rendered as `EventWriter` renders it, into the same choice.

So, from an upstream that writes OpenAI's chunks as the gateway renders them, both paths send
the same bytes (tests/integration/test_upstream_passthrough.py holds them to it); from
another, the chunks keep the upstream's other fields (vLLM's `stop_reason`, say) and their
order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeGuard

from sluicegate import fast_json
from sluicegate.engine.protocol import ChoiceDelta
from sluicegate.observability.metrics import UPSTREAM_PASSED_THROUGH
from sluicegate.wire.events import EventWriter
from sluicegate.wire.formats import ChatFormat, CompletionFormat, ResponseFormat

_SEPARATORS = (":", ": ")
"""How a server writes a key and its value: compact JSON (vLLM's, OpenAI's) or spaced
(Python's `json.dumps` defaults: llama.cpp's Python server)."""


def passes_through(fmt: ResponseFormat) -> TypeGuard[ChatFormat | CompletionFormat]:
    """Whether a stream in `fmt` can be its engine's events: a chat without tools, or a text
    completion (not the Responses or Messages APIs, whose events are their own)."""
    if type(fmt) is ChatFormat:
        return fmt.tools.mode == "none"
    return type(fmt) is CompletionFormat


class PassThroughWriter(EventWriter):
    def __init__(self, fmt: ChatFormat | CompletionFormat) -> None:
        super().__init__(fmt)
        self._envelope = fmt
        self._swaps: list[tuple[str, str]] | None = None

    def events(self, delta: ChoiceDelta) -> Iterator[bytes]:
        raw = delta.raw
        if raw is None:
            yield from super().events(delta)
            return
        self.account(delta)
        swaps = self._swaps
        if swaps is None:
            swaps = self._swaps = self._learn(raw)
            UPSTREAM_PASSED_THROUGH.inc()
        for old, new in swaps:
            raw = raw.replace(old, new)
        yield raw.encode()

    def _learn(self, raw: str) -> list[tuple[str, str]]:
        """The replacements that put the run's envelope in the upstream's events, read off
        the first event: each field as that server writes it (compact or spaced)."""
        first = raw[len("data: ") : raw.index("\n\n")]
        event = fast_json.loads(first)
        fmt = self._envelope
        swaps: list[tuple[str, str]] = []
        for name, ours in (("id", fmt.id), ("created", fmt.created), ("model", fmt.model)):
            theirs = event.get(name)
            if theirs is None or theirs == ours:
                continue
            for sep in _SEPARATORS:
                old = f'"{name}"{sep}{_json(theirs)}'
                if old in first:
                    swaps.append((old, f'"{name}"{sep}{_json(ours)}'))
                    break
        if not fmt.include_usage:
            for sep in _SEPARATORS:
                null = f'"usage"{sep}null'
                if null in first:
                    swaps.extend(((f",{null}", ""), (f", {null}", "")))
                    break
        return swaps


def _json(value: object) -> str:
    return fast_json.dumps(value).decode()

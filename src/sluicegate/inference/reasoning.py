"""The gateway's split of a run's output into thoughts and answer (`ReasoningSplit`).

An engine that has a reasoning parser (`EngineClient.reasoning_parser`: the in-process one,
over vLLM's own parsers) hands on token ids with each delta; here each choice gets a parser
of its own, fed its deltas in order, and each delta leaves with `reasoning` and `text` (the
answer) split, the finishing one with the choice's reasoning tokens counted. Only chat-shaped
runs are split (chat completions and the formats that wrap them), as vLLM's server splits
chats and not completions. The ids are dropped once read: the cache keeps the split, so a
hit renders as the live run did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sluicegate.engine.protocol import ChoiceDelta, Prompt, ReasoningParser, ReasoningStream
from sluicegate.wire.formats import ChatFormat, ResponseFormat


def chat_shaped(fmt: ResponseFormat) -> bool:
    """Whether the run's answer is a chat message: chat completions, or a format wrapping
    their format (Responses, Messages)."""
    inner: object = fmt
    while not isinstance(inner, ChatFormat) and hasattr(inner, "chat"):
        inner = inner.chat
    return isinstance(inner, ChatFormat)


class ReasoningSplit:
    """One run's split: a parser stream per choice, made on the choice's first delta."""

    def __init__(
        self,
        parser: ReasoningParser,
        prompts: Sequence[Prompt],
        n: int,
        template_kwargs: Mapping[str, Any],
    ):
        """`n` choices per prompt; choice i is of prompt i // n (`Run.choice_index`)."""
        self._parser = parser
        self._prompts = prompts
        self._n = n
        self._kwargs = template_kwargs
        self._streams: dict[int, ReasoningStream] = {}

    def split(self, delta: ChoiceDelta) -> None:
        """Split `delta` (indexed as the run's choice) in place."""
        stream = self._streams.get(delta.index)
        if stream is None:
            prompt = self._prompts[delta.index // self._n]
            stream = self._streams[delta.index] = self._parser.stream(prompt.ids, self._kwargs)
        finished = delta.finish_reason is not None
        reasoning, content = stream.feed(delta.text, delta.token_ids or (), finished)
        delta.reasoning += reasoning
        delta.text = content
        delta.token_ids = None
        if finished:
            delta.reasoning_tokens = stream.count()
            del self._streams[delta.index]

"""What a run produced, delta by delta, independent of the wire format.

Formats render it (`formats`), streams replay it (`events`) and the cache stores it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, NotRequired, cast

from typing_extensions import TypedDict

from sluicegate.engine.protocol import ChoiceDelta, FinishReason, TokenLogprob
from sluicegate.errors import EngineUnavailableError


class CompletionTokensDetails(TypedDict):
    reasoning_tokens: int


class Usage(TypedDict):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    completion_tokens_details: NotRequired[CompletionTokensDetails]
    """Set when the output was split by a reasoning parser, or some of it counted as
    reasoning (OpenAI's and vLLM's `reasoning_tokens`)."""


@dataclass(slots=True)
class ChoiceState:
    """What one choice has produced so far, delta by delta.

    The deltas are kept as they came (`text_parts`, with reasoning `reasoning_parts` beside
    them, and with logprobs `logprob_counts` entries of `logprobs` per part), so a cached
    response replays as a stream shaped like the live one.
    With `retain` off only the counts are kept (tokens, text length for logprob offsets): what
    a stream needs once its deltas are sent, so a long stream holds nothing per token.
    """

    index: int
    text_parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    logprob_counts: list[int] | None = None
    num_tokens: int = 0
    text_length: int = 0
    token_text_length: int = 0
    """The length of the token strings reported with logprobs (where offsets continue)."""
    finish_reason: str | None = None
    stop_sequence: str | None = None
    """The stop string that ended the choice, where the engine said."""
    retain: bool = True
    render: Any = None
    """The response format's own state for this choice in a stream (a tool-call scanner)."""
    reasoning_parts: list[str] | None = None
    """Each delta's reasoning, aligned with `text_parts`; None until a delta has some."""
    reasoning_tokens: int = 0

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    @property
    def reasoning(self) -> str | None:
        """The choice's thoughts; None when it had none."""
        return None if self.reasoning_parts is None else "".join(self.reasoning_parts)

    def add(self, delta: ChoiceDelta) -> None:
        self.text_length += len(delta.text)
        self.num_tokens += delta.num_tokens
        self.reasoning_tokens += delta.reasoning_tokens
        if delta.logprobs:
            self.token_text_length += sum(len(e.token) for e in delta.logprobs)
        if not self.retain:
            return
        self.text_parts.append(delta.text)
        if delta.reasoning:
            if self.reasoning_parts is None:
                self.reasoning_parts = [""] * (len(self.text_parts) - 1)
            self.reasoning_parts.append(delta.reasoning)
        elif self.reasoning_parts is not None:
            self.reasoning_parts.append("")
        if delta.logprobs is not None:
            if self.logprobs is None or self.logprob_counts is None:
                self.logprobs, self.logprob_counts = [], [0] * (len(self.text_parts) - 1)
            self.logprobs.extend(delta.logprobs)
            self.logprob_counts.append(len(delta.logprobs))
        elif self.logprob_counts is not None:
            self.logprob_counts.append(0)

    def deltas(self) -> Iterator[ChoiceDelta]:
        """The deltas this choice was built from, without token counts or finish reason."""
        start = 0
        reasoning = self.reasoning_parts
        for i, text in enumerate(self.text_parts):
            logprobs = None
            if self.logprobs is not None and self.logprob_counts is not None:
                end = start + self.logprob_counts[i]
                logprobs, start = self.logprobs[start:end], end
            delta = ChoiceDelta(self.index, text, 0, None, logprobs)
            if reasoning is not None:
                delta.reasoning = reasoning[i]
            yield delta

    def end(self) -> ChoiceDelta:
        """The delta that closes this choice: its token counts and finish reason."""
        return ChoiceDelta(
            self.index,
            "",
            self.num_tokens,
            cast(FinishReason, self.finish_reason),
            stop_sequence=self.stop_sequence,
            reasoning_tokens=self.reasoning_tokens,
        )


class Collector:
    """Choice states built from the deltas of a run (indexes already the response's)."""

    def __init__(self, indexes: Iterable[int] = ()) -> None:
        self._states = {i: ChoiceState(i) for i in indexes}

    def add(self, delta: ChoiceDelta) -> None:
        state = self._states.get(delta.index)
        if state is None:
            state = self._states[delta.index] = ChoiceState(delta.index)
        state.add(delta)
        if delta.finish_reason is not None:
            state.finish_reason = checked_finish(delta.finish_reason)
            state.stop_sequence = delta.stop_sequence

    def completion(self, prompt_tokens: int) -> Completion:
        return Completion([self._states[k] for k in sorted(self._states)], prompt_tokens)


@dataclass(slots=True)
class Completion:
    """Everything a run produced, independent of the wire format (and what the cache keeps)."""

    choices: list[ChoiceState]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(c.num_tokens for c in self.choices)

    @property
    def reasoning_tokens(self) -> int:
        return sum(c.reasoning_tokens for c in self.choices)

    @property
    def usage(self) -> Usage:
        return usage(self.prompt_tokens, self.completion_tokens, self.reasoning_tokens)

    @property
    def finish_reasons(self) -> list[str | None]:
        return [c.finish_reason for c in self.choices]

    def deltas(self) -> Iterator[ChoiceDelta]:
        """The deltas that made this completion, each choice closed by its `end`."""
        for choice in self.choices:
            yield from choice.deltas()
            yield choice.end()


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0) -> Usage:
    """OpenAI's usage; `completion_tokens_details` only when some output was reasoning (a
    format that reasons adds it at 0: `with_reasoning_details`)."""
    counted: Usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if reasoning_tokens:
        counted["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return counted


def with_reasoning_details(counted: Usage) -> Usage:
    """`counted` with `completion_tokens_details` however little was reasoning, as vLLM's
    server writes it whenever a reasoning parser split the output."""
    if "completion_tokens_details" in counted:
        return counted
    return {**counted, "completion_tokens_details": {"reasoning_tokens": 0}}


def checked_finish(reason: str) -> str:
    """A finish reason to send; "abort" is refused: we never abort a request we are still
    reading, so the engine dropped it."""
    if reason == "abort":
        raise EngineUnavailableError("The inference engine aborted the request.")
    return reason

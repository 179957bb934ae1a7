"""The stored form of a cached completion, and its strict decoding.

Entries are JSON carrying a format version and the key they were written under. Anything
else found under a key (a foreign writer, a truncated value, an older layout) is refused
with `CorruptEntryError`, so the caller treats it as a miss and never serves it.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob
from sluicegate.wire.completion import ChoiceState, Completion

ENTRY_VERSION = 1


class CorruptEntryError(Exception):
    """The value under a cache key is not an entry this gateway wrote for that key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Logprob(_Strict):
    token: str
    logprob: float | None = None
    """None (left out of the entry) for an echoed prompt's first token."""
    top: list[tuple[str, float]] = Field(default_factory=list)


class _Choice(_Strict):
    index: int = Field(ge=0)
    parts: list[str]
    num_tokens: int = Field(ge=0)
    finish_reason: str
    stop_sequence: str | None = None
    logprobs: list[_Logprob] | None = None
    logprob_counts: list[int] | None = None
    reasoning: list[str] | None = None
    """Each part's reasoning (aligned with `parts`); left out when the choice had none."""
    reasoning_tokens: int | None = Field(default=None, ge=0)
    """Left out at 0, so entries without reasoning read as those written before it."""


class _Entry(_Strict):
    version: int
    key: str
    created: float
    prompt_tokens: int = Field(ge=0)
    choices: list[_Choice]


# Upper bounds of the encoded entry's parts beyond its strings: the envelope, a choice's fields,
# a float as JSON (`-1.2345678901234567e-308`), one logprob's and one alternative's framing.
_ENVELOPE = 128
_CHOICE = 96
_FLOAT = 25
_LOGPROB = 32 + _FLOAT
_ALTERNATIVE = 4 + _FLOAT


class EntrySize:
    """A running upper bound of the size of the entry a run's deltas would encode to, so a run
    can tell when its output has outgrown an entry without building one."""

    def __init__(self, key: str, choices: int) -> None:
        self.bytes = _ENVELOPE + len(key) + choices * _CHOICE

    def add(self, delta: ChoiceDelta) -> int:
        """Count one delta; the bound so far."""
        # The part, its comma, and its entry in `logprob_counts`; its reasoning and comma (an
        # entry of `reasoning` for each part once one has some: bounded by 3 bytes a part).
        size = _json_size(delta.text) + 1 + _json_size(delta.reasoning) + 1
        if delta.logprobs is not None:
            size += len(str(len(delta.logprobs))) + 1
            for e in delta.logprobs:
                size += _LOGPROB + _json_size(e.token)
                size += sum(_ALTERNATIVE + _json_size(token) for token, _ in e.top)
        self.bytes += size
        return self.bytes


def _json_size(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode())


def encode_entry(key: str, completion: Completion, created: float) -> bytes:
    choices = [
        _Choice(
            index=c.index,
            parts=c.text_parts,
            num_tokens=c.num_tokens,
            finish_reason=c.finish_reason or "stop",
            stop_sequence=c.stop_sequence,
            logprobs=None
            if c.logprobs is None
            else [_Logprob(token=e.token, logprob=e.logprob, top=list(e.top)) for e in c.logprobs],
            logprob_counts=c.logprob_counts,
            reasoning=c.reasoning_parts,
            reasoning_tokens=c.reasoning_tokens or None,
        )
        for c in completion.choices
    ]
    entry = _Entry(
        version=ENTRY_VERSION,
        key=key,
        created=created,
        prompt_tokens=completion.prompt_tokens,
        choices=choices,
    )
    return entry.model_dump_json(exclude_none=True).encode()


def decode_entry(key: str, data: bytes) -> tuple[Completion, float]:
    """The completion stored under `key` and its creation time (Unix seconds)."""
    try:
        entry = _Entry.model_validate_json(data)
    except (ValidationError, ValueError) as exc:
        raise CorruptEntryError(f"undecodable cache entry ({len(data)} bytes)") from exc
    if entry.version != ENTRY_VERSION or entry.key != key:
        raise CorruptEntryError("cache entry written for another key or format version")
    choices = []
    for c in entry.choices:
        if c.logprobs is not None and (
            c.logprob_counts is None
            or len(c.logprob_counts) != len(c.parts)
            or sum(c.logprob_counts) != len(c.logprobs)
        ):
            raise CorruptEntryError("cache entry with inconsistent logprobs")
        if c.reasoning is not None and len(c.reasoning) != len(c.parts):
            raise CorruptEntryError("cache entry with inconsistent reasoning")
        choices.append(
            ChoiceState(
                index=c.index,
                text_parts=list(c.parts),
                logprobs=None
                if c.logprobs is None
                else [TokenLogprob(e.token, e.logprob, tuple(e.top)) for e in c.logprobs],
                logprob_counts=None if c.logprobs is None else list(c.logprob_counts or ()),
                reasoning_parts=None if c.reasoning is None else list(c.reasoning),
                num_tokens=c.num_tokens,
                reasoning_tokens=c.reasoning_tokens or 0,
                text_length=sum(len(p) for p in c.parts),
                finish_reason=c.finish_reason,
                stop_sequence=c.stop_sequence,
            )
        )
    return Completion(choices, entry.prompt_tokens), entry.created

"""OpenAI response bodies and stream chunks, built from engine deltas.

`ChatFormat` and `CompletionFormat` share one interface, so the service drives chat and text
completions through the same loop; only the JSON shapes differ.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from typing_extensions import TypedDict

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob
from sluicegate.wire.completion import ChoiceState, Completion, Usage


class ChatLogprobEntry(TypedDict):
    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[dict[str, Any]]


class CompletionLogprobs(TypedDict):
    tokens: list[str]
    token_logprobs: list[float | None]
    """None for an echoed prompt's first token, which nothing predicts."""
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class ModelCard(TypedDict):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    max_model_len: int


class ResponseFormat(Protocol):
    def first_chunk(self, index: int) -> dict[str, Any] | None:
        """The chunk that opens a choice in a stream, if the format has one."""
        ...

    def delta_chunk(self, state: ChoiceState, delta: ChoiceDelta) -> dict[str, Any]: ...

    def finish_chunk(self, index: int, finish_reason: str) -> dict[str, Any]: ...

    def usage_chunk(self, usage: Usage) -> dict[str, Any]: ...

    def response(self, completion: Completion) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class _Envelope:
    id: str
    created: int
    model: str
    include_usage: bool

    def chunk(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_body(self, obj: str, usage: Usage) -> dict[str, Any]:
        body = self.chunk(obj, [])
        body["usage"] = usage
        return body


class ChatFormat(_Envelope):
    CHUNK = "chat.completion.chunk"

    def first_chunk(self, index: int) -> dict[str, Any]:
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self.chunk(self.CHUNK, [choice])

    def delta_chunk(self, state: ChoiceState, delta: ChoiceDelta) -> dict[str, Any]:
        logprobs = None if delta.logprobs is None else {"content": _chat_logprobs(delta.logprobs)}
        choice = {
            "index": delta.index,
            "delta": {"content": delta.text},
            "logprobs": logprobs,
            "finish_reason": None,
        }
        return self.chunk(self.CHUNK, [choice])

    def finish_chunk(self, index: int, finish_reason: str) -> dict[str, Any]:
        choice = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}
        return self.chunk(self.CHUNK, [choice])

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.usage_body(self.CHUNK, usage)

    def response(self, completion: Completion) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": c.index,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None
                    if c.logprobs is None
                    else {"content": _chat_logprobs(c.logprobs)},
                    "finish_reason": c.finish_reason,
                }
                for c in completion.choices
            ],
            "usage": completion.usage,
        }


def chat_format(model: str, include_usage: bool) -> ChatFormat:
    """The format of a new chat completion response, with its own id and creation time."""
    return ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model, include_usage)


class CompletionFormat(_Envelope):
    OBJECT = "text_completion"

    def first_chunk(self, index: int) -> None:
        return None

    def delta_chunk(self, state: ChoiceState, delta: ChoiceDelta) -> dict[str, Any]:
        logprobs = None
        if delta.logprobs is not None:
            # Offsets continue from the tokens this choice reported before this delta (as in
            # vLLM's server: text held back for stop strings lags the tokens).
            start = state.token_text_length - sum(len(e.token) for e in delta.logprobs)
            logprobs = _completion_logprobs(delta.logprobs, start)
        choice = {
            "index": delta.index,
            "text": delta.text,
            "logprobs": logprobs,
            "finish_reason": None,
        }
        return self.chunk(self.OBJECT, [choice])

    def finish_chunk(self, index: int, finish_reason: str) -> dict[str, Any]:
        choice = {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason}
        return self.chunk(self.OBJECT, [choice])

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.usage_body(self.OBJECT, usage)

    def response(self, completion: Completion) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.OBJECT,
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": c.index,
                    "text": c.text,
                    "logprobs": None if c.logprobs is None else _completion_logprobs(c.logprobs, 0),
                    "finish_reason": c.finish_reason,
                }
                for c in completion.choices
            ],
            "usage": completion.usage,
        }


def completion_format(model: str, include_usage: bool) -> CompletionFormat:
    """The format of a new text completion response, with its own id and creation time."""
    return CompletionFormat(f"cmpl-{uuid.uuid4().hex}", int(time.time()), model, include_usage)


def _chat_logprobs(entries: list[TokenLogprob]) -> list[ChatLogprobEntry]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": list(e.token.encode("utf-8")),
            "top_logprobs": [
                {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8"))}
                for tok, lp in e.top
            ],
        }
        for e in entries
    ]


def _completion_logprobs(entries: list[TokenLogprob], start_offset: int) -> CompletionLogprobs:
    offsets = []
    offset = start_offset
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        # As OpenAI's legacy API and vLLM's server: the sampled token is always among them
        # (up to k + 1 entries), so `logprobs: 0` still names each token's logprob.
        "top_logprobs": [
            None if e.logprob is None else {e.token: e.logprob, **dict(e.top)} for e in entries
        ],
        "text_offset": offsets,
    }

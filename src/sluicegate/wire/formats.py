"""OpenAI response bodies and stream chunks, built from engine deltas.

`ChatFormat` and `CompletionFormat` share one interface, so the service drives chat and text
completions through the same loop; only the JSON shapes differ.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from typing_extensions import TypedDict

from sluicegate.engine.protocol import ChoiceDelta, TokenLogprob, ToolCallParser
from sluicegate.observability.metrics import count_tool_calls
from sluicegate.wire.completion import ChoiceState, Completion, Usage, with_reasoning_details
from sluicegate.wire.tool_calls import Rendered, ToolStream, tool_stream, whole_calls
from sluicegate.wire.tools import NO_TOOLS, ToolSetup


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
    """OpenAI's model object, with vLLM's fields: `root` (what the name serves), `parent` (an
    adapter's base model) and `max_model_len`."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int


class ResponseFormat(Protocol):
    def first_chunk(self, index: int) -> dict[str, Any] | None:
        """The chunk that opens a choice in a stream, if the format has one."""
        ...

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        """The chunks a delta of the choice makes (none while a format holds text back)."""
        ...

    def finish_chunks(self, state: ChoiceState) -> list[dict[str, Any]]:
        """The chunks that close the choice (`state.finish_reason` is set)."""
        ...

    def usage_chunk(self, usage: Usage) -> dict[str, Any]: ...

    def response(self, completion: Completion) -> dict[str, Any]: ...

    def renewed(self) -> ResponseFormat:
        """The same format for another response: its own id and creation time."""
        ...

    def renders_alike(self) -> bool:
        """Whether two renderings of one completion differ only in their id and creation
        time, so a rendered body can be kept and reused (not with tool calls: each rendering
        gives its calls ids of their own, and counts them)."""
        ...


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

    def renewed(self) -> Any:
        prefix = self.id.split("-", 1)[0]
        return dataclasses.replace(
            self, id=f"{prefix}-{uuid.uuid4().hex}", created=int(time.time())
        )

    def renders_alike(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class ChatFormat(_Envelope):
    """Chat completions. With tools, the text of each choice is turned into `tool_calls`
    here (`wire.tool_calls`), so that cached text renders as the live run did."""

    tools: ToolSetup = NO_TOOLS
    parser: ToolCallParser | None = None
    """The tool parser for `auto` (none: `auto` answers with text)."""
    reasons: bool = False
    """A reasoning parser splits the output (the engine's or the gateway's): messages carry
    `reasoning` (null when none) and usage `completion_tokens_details`, as vLLM's server
    writes them. Thoughts an upstream split are rendered either way."""
    include_reasoning: bool = True
    """`include_reasoning`: false leaves the thoughts out of the answer."""

    CHUNK = "chat.completion.chunk"

    def renders_alike(self) -> bool:
        return self.tools.mode == "none"

    def first_chunk(self, index: int) -> dict[str, Any]:
        content = None if self.tools.mode in ("required", "named") else ""
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": content},
            "logprobs": None,
            "finish_reason": None,
        }
        return self.chunk(self.CHUNK, [choice])

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        logprobs = None if delta.logprobs is None else {"content": _chat_logprobs(delta.logprobs)}
        if self._hides(delta.reasoning):
            logprobs = None
        thought = delta.reasoning if self.include_reasoning else ""
        if self.tools.mode == "none":
            if not delta.text and not logprobs and not thought:
                return []
            fields: dict[str, Any] = {"reasoning": thought} if thought else {}
            if delta.text or not thought:
                fields["content"] = delta.text
            return [self._delta(delta.index, fields, logprobs)]
        rendered = self._stream(state).feed(delta.text)
        chunks = self._rendered(delta.index, rendered)
        if thought:
            chunks.insert(0, self._delta(delta.index, {"reasoning": thought}, None))
        if logprobs is not None:
            if not chunks:
                return [self._delta(delta.index, {}, logprobs)]
            chunks[0]["choices"][0]["logprobs"] = logprobs
        return chunks

    def finish_chunks(self, state: ChoiceState) -> list[dict[str, Any]]:
        reason: str | None = state.finish_reason or "stop"
        chunks: list[dict[str, Any]] = []
        if self.tools.mode != "none":
            stream = self._stream(state)
            chunks = self._rendered(state.index, stream.finish())
            reason = self._finish_reason(stream, reason)
        choice = {"index": state.index, "delta": {}, "logprobs": None, "finish_reason": reason}
        return [*chunks, self.chunk(self.CHUNK, [choice])]

    def usage_chunk(self, usage: Usage) -> dict[str, Any]:
        return self.usage_body(self.CHUNK, with_reasoning_details(usage) if self.reasons else usage)

    def response(self, completion: Completion) -> dict[str, Any]:
        usage = completion.usage
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": c.index,
                    "logprobs": None
                    if c.logprobs is None or self._hides(c.reasoning)
                    else {"content": _chat_logprobs(c.logprobs)},
                    **self._message(c),
                }
                for c in completion.choices
            ],
            "usage": with_reasoning_details(usage) if self.reasons else usage,
        }

    def _hides(self, reasoning: str | None) -> bool:
        """Whether logprobs are left out with the thoughts (`include_reasoning` false): a
        thought's tokens would show in them. As vLLM's server, for every chunk of a model that
        reasons; and for any output that held thoughts (an upstream that ignored the field)."""
        return not self.include_reasoning and (self.reasons or bool(reasoning))

    def _message(self, choice: ChoiceState) -> dict[str, Any]:
        reason = choice.finish_reason
        message: dict[str, Any] = {"role": "assistant", "content": choice.text}
        thought = choice.reasoning if self.include_reasoning else None
        if thought is not None or self.reasons:
            message["reasoning"] = thought
        if self.tools.mode == "none":
            if self.reasons and not choice.text:
                # vLLM's parsers give no answer (null), not an empty one, when the output
                # was all thoughts.
                message["content"] = None
            return {"message": message, "finish_reason": reason}
        stream = whole_calls(self.tools, self.parser, choice.text)
        message["content"] = stream.content()
        calls = stream.calls()
        if calls and self.tools.legacy:
            _, name, arguments = calls[0]
            message["function_call"] = {"name": name, "arguments": arguments}
        elif calls:
            message["tool_calls"] = [
                {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
                for id_, name, args in calls
            ]
        elif self.tools.mode not in ("required", "named"):
            # Null for an answer that was all thoughts, as without tools.
            empty = None if self.reasons and not choice.text else ""
            message["content"] = message["content"] or empty
        return {"message": message, "finish_reason": self._finish_reason(stream, reason)}

    def _finish_reason(self, stream: ToolStream, reason: str | None) -> str | None:
        """OpenAI's: `tool_calls` when the model called tools (auto, required) and stopped by
        itself; a named function's call ends with `stop`. Counted once per choice."""
        count_tool_calls(self.tools.mode, [args for _, _, args in stream.calls()])
        if stream.called and reason == "stop" and self.tools.mode in ("auto", "required"):
            return "function_call" if self.tools.legacy else "tool_calls"
        return reason

    def _stream(self, state: ChoiceState) -> ToolStream:
        if state.render is None:
            state.render = tool_stream(self.tools, self.parser)
        stream: ToolStream = state.render
        return stream

    def _rendered(self, index: int, rendered: Rendered) -> list[dict[str, Any]]:
        chunks = []
        if rendered.content:
            chunks.append(self._delta(index, {"content": rendered.content}, None))
        if rendered.calls and self.tools.legacy:
            # The legacy shape carries one call: the first one's opening and arguments.
            for call in (c for c in rendered.calls if c.index == 0):
                opening = {"name": call.name} if call.name is not None else {}
                delta = {"function_call": {**opening, "arguments": call.arguments}}
                chunks.append(self._delta(index, delta, None))
        elif rendered.calls:
            calls = [c.wire() for c in rendered.calls]
            chunks.append(self._delta(index, {"tool_calls": calls}, None))
        return chunks

    def _delta(self, index: int, delta: dict[str, Any], logprobs: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return self.chunk(self.CHUNK, [choice])


def chat_format(
    model: str,
    include_usage: bool,
    tools: ToolSetup = NO_TOOLS,
    parser: ToolCallParser | None = None,
    *,
    reasons: bool = False,
    include_reasoning: bool = True,
) -> ChatFormat:
    """The format of a new chat completion response, with its own id and creation time."""
    return ChatFormat(
        f"chatcmpl-{uuid.uuid4().hex}",
        int(time.time()),
        model,
        include_usage,
        tools,
        parser,
        reasons,
        include_reasoning,
    )


@dataclass(frozen=True, slots=True)
class CompletionFormat(_Envelope):
    OBJECT = "text_completion"

    def first_chunk(self, index: int) -> None:
        return None

    def delta_chunks(self, state: ChoiceState, delta: ChoiceDelta) -> list[dict[str, Any]]:
        return [self._delta_chunk(state, delta)]

    def _delta_chunk(self, state: ChoiceState, delta: ChoiceDelta) -> dict[str, Any]:
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

    def finish_chunks(self, state: ChoiceState) -> list[dict[str, Any]]:
        choice = {
            "index": state.index,
            "text": "",
            "logprobs": None,
            "finish_reason": state.finish_reason,
        }
        return [self.chunk(self.OBJECT, [choice])]

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

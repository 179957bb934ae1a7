"""Our prompts and sampling options as OpenAI request bodies; upstream SSE as engine steps.

Every request goes upstream streamed, with `stream_options.include_usage`, whatever the
client asked: one parser serves both, and a non-streamed client answer is assembled by the
gateway as for the in-process engine. Parameters at their OpenAI default are left out, so an
upstream that does not know vLLM's extensions (`top_k`, `min_p`, ...) is not sent them
unless the client asked for them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate import fast_json
from sluicegate.engine.protocol import (
    ChatPrompt,
    ChoiceDelta,
    EngineStep,
    FinishReason,
    Prompt,
    SamplingOptions,
    StructuredOutput,
    TokenLogprob,
)
from sluicegate.engine.upstream.tool_calls import encode_call_fragment, encode_content

logger = logging.getLogger(__name__)

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "length": "length",
    "tool_calls": "stop",
    "function_call": "stop",
    "content_filter": "stop",
    "abort": "abort",
}


def request_body(
    model: str, prompt: Prompt, options: SamplingOptions, explicit_max_tokens: bool = True
) -> tuple[str, dict[str, Any]]:
    """The path (under /v1) and the JSON body for the upstream."""
    body: dict[str, Any] = {"model": model}
    chat = prompt.chat
    if chat is not None:
        path = "/chat/completions"
        body["messages"] = [wire_message(m) for m in chat.messages]
        _chat_tools(body, chat)
    else:
        path = "/completions"
        body["prompt"] = prompt.text if prompt.text is not None else prompt.ids
    body["stream"] = True
    body["stream_options"] = {"include_usage": True}
    if explicit_max_tokens:
        # `max_tokens`, not chat's newer `max_completion_tokens`, which llama.cpp ignores.
        body["max_tokens"] = options.max_tokens
    _sampling(body, options, chat is not None)
    return path, body


def _chat_tools(body: dict[str, Any], chat: ChatPrompt) -> None:
    if chat.tools:
        body["tools"] = [dict(t) for t in chat.tools]
        if chat.tool_choice is not None:
            body["tool_choice"] = chat.tool_choice
        if not chat.parallel_tool_calls:
            body["parallel_tool_calls"] = False


_DEFAULTS: tuple[tuple[str, str, object], ...] = (
    # (our option, the body's field, its default)
    ("temperature", "temperature", None),
    ("top_p", "top_p", 1.0),
    ("top_k", "top_k", 0),
    ("min_p", "min_p", 0.0),
    ("n", "n", 1),
    ("seed", "seed", None),
    ("presence_penalty", "presence_penalty", 0.0),
    ("frequency_penalty", "frequency_penalty", 0.0),
    ("repetition_penalty", "repetition_penalty", 1.0),
    ("ignore_eos", "ignore_eos", False),
    ("min_tokens", "min_tokens", 0),
)


def _sampling(body: dict[str, Any], options: SamplingOptions, chat: bool) -> None:
    for name, key, default in _DEFAULTS:
        value = getattr(options, name)
        if value != default:
            body[key] = value
    if options.stop:
        body["stop"] = list(options.stop)
    if options.logit_bias:
        body["logit_bias"] = {str(token): bias for token, bias in options.logit_bias}
    if options.logprobs is not None:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = options.logprobs
        else:
            body["logprobs"] = options.logprobs
    if options.structured is not None:
        body.update(_structured(options.structured))


def _structured(structured: StructuredOutput) -> dict[str, Any]:
    if structured.json is not None:
        schema = json.loads(structured.json)
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "output", "schema": schema, "strict": True},
            }
        }
    if structured.json_object:
        return {"response_format": {"type": "json_object"}}
    # vLLM's own structured outputs: an upstream without them refuses (400) or ignores them.
    if structured.regex is not None:
        return {"structured_outputs": {"regex": structured.regex}}
    if structured.choice is not None:
        return {"structured_outputs": {"choice": list(structured.choice)}}
    return {"structured_outputs": {"grammar": structured.grammar}}


def wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message as OpenAI's wire has it: tool-call arguments as JSON text (templates take
    them parsed)."""
    calls = message.get("tool_calls")
    if not calls:
        return dict(message)
    wired = dict(message)
    wired["tool_calls"] = [
        {
            **call,
            "function": {
                **call["function"],
                "arguments": _arguments_text(call["function"].get("arguments")),
            },
        }
        for call in calls
    ]
    return wired


def _arguments_text(arguments: object) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class StreamReader:
    """Turns an upstream's SSE events into engine steps.

    Each content piece counts as one token (servers stream one token per event); the
    finishing deltas are held until the usage arrives, to settle the count on what the
    upstream reports. With `records` (the gateway reads the text with the upstream tool
    parser, `tool_calls.reads_records`), tool calls are carried as records in the text and
    content holding a record's separator as a record too; without, content goes as it came,
    and calls (which the upstream was not asked for) are dropped: nothing would read them."""

    choices: int
    records: bool = False
    raw: bool = False
    """Pass-through (`SamplingOptions.pass_through`, one choice): each step's delta carries
    the events it came from (`ChoiceDelta.raw`), and a plain chunk (text, no finish reason,
    usage or error) is handed on without being parsed."""
    window: int = 1 << 20
    """The model's context window: a usage that counts more than the request could have used
    (a prompt above it, or more completion tokens than `choices` windows) is not believed."""
    counted: dict[int, int] = field(default_factory=dict)
    held: list[ChoiceDelta] = field(default_factory=list)
    usage: Usage | None = None
    done: bool = False

    def feed_lines(self, lines: list[str]) -> EngineStep | None:
        """Lines of the event stream as they came in one read: one step for all they add
        (each choice's text joined), if anything."""
        if self.raw:
            return self._feed_raw(lines)
        merged: dict[int, ChoiceDelta] = {}
        for line in lines:
            if self.done or not line.startswith("data:"):
                continue
            step = self.feed(line[5:].strip())
            for delta in step.choices if step is not None else ():
                found = merged.get(delta.index)
                if found is None:
                    merged[delta.index] = delta
                    continue
                found.text += delta.text
                found.num_tokens += delta.num_tokens
                if delta.logprobs:
                    found.logprobs = (found.logprobs or []) + delta.logprobs
        return EngineStep(choices=list(merged.values())) if merged else None

    def _feed_raw(self, lines: list[str]) -> EngineStep | None:
        """`feed_lines` passing the events through: one delta for the choice chunks of the
        read, counted as `feed` counts them (a token per chunk with text). A plain chunk (text
        only) is handed on without being parsed; another is parsed as `feed` does: the usage
        event is kept (not handed on: the gateway renders its own), an error raised, and the
        finishing chunk held with its event until the usage has come, as `feed` holds it."""
        passed: list[str] = []
        tokens = 0
        plain = 0  # plain chunks with text, counted once for the read
        for line in lines:
            if not line.startswith("data:") or self.done:
                continue
            data = line[5:].strip()
            if "\r" in data:
                # A CR ends a line for the client's SSE parser: handed on, this event would
                # reach it as two lines. Valid JSON holds a bare CR only between tokens,
                # where it goes without a change of meaning (in a string it fails to parse,
                # as any broken event does).
                fast_json.loads(data)
                data = data.replace("\r", "")
            if _plain_chunk(data):
                passed.append(data)
                if not _empty_text(data):
                    plain += 1
                continue
            event = self._event(data)
            if event is None:
                continue
            held = len(self.held)
            deltas = list(self._deltas(event.get("choices") or ()))
            if len(self.held) > held:
                self.held[-1].raw = _framed([data])
            elif event.get("choices"):
                passed.append(data)
                tokens += sum(d.num_tokens for d in deltas)
        if plain:
            self.counted[0] = self.counted.get(0, 0) + plain
            tokens += plain
        if not passed:
            return None
        return EngineStep(choices=[ChoiceDelta(0, "", tokens, raw=_framed(passed))])

    def feed(self, data: str) -> EngineStep | None:
        """One event's data; a step for what it adds, if anything."""
        event = self._event(data)
        if event is None:
            return None
        deltas = list(self._deltas(event.get("choices") or ()))
        return EngineStep(choices=deltas) if deltas else None

    def _event(self, data: str) -> dict[str, Any] | None:
        """One event's data parsed, its usage kept; None for `[DONE]`. Raises
        `UpstreamStreamError` for an error event, ValueError for what is not an object."""
        if data == "[DONE]":
            self.done = True
            return None
        event = fast_json.loads(data)
        if not isinstance(event, dict):
            raise ValueError("an event that is not a JSON object")
        if "error" in event and "choices" not in event:
            raise UpstreamStreamError(event["error"])
        usage = event.get("usage")
        if isinstance(usage, dict):
            prompt = token_count(usage.get("prompt_tokens"), self.window)
            completion = token_count(usage.get("completion_tokens"), self.window * self.choices)
            if prompt is None or completion is None:
                # Negative counts would be refunds to the key's budget and quotas, absurd
                # ones charges it never ran up: the gateway's own counts stand instead.
                logger.warning("an upstream reported a usage that cannot be: %.200r", usage)
            else:
                self.usage = Usage(prompt, completion)
        return event

    def finish(self) -> EngineStep:
        """The last step: the held finishing deltas, with the counts settled."""
        usage = self.usage
        if usage is not None and self.held and self.choices == 1:
            counted = sum(self.counted.values())
            self.held[0].num_tokens += usage.completion_tokens - counted
        return EngineStep(
            choices=self.held,
            prompt_tokens=0 if usage is None else usage.prompt_tokens,
            finished=True,
        )

    def _deltas(self, choices: Any) -> Iterator[ChoiceDelta]:
        for choice in choices:
            index = int(choice.get("index") or 0)
            text = _choice_text(choice, self.records)
            reason = choice.get("finish_reason")
            logprobs = _logprobs(choice.get("logprobs"))
            tokens = 1 if text or logprobs else 0
            if logprobs:
                tokens = len(logprobs)
            self.counted[index] = self.counted.get(index, 0) + tokens
            delta = ChoiceDelta(index, text, tokens, None, logprobs)
            if reason is None:
                if text or logprobs:
                    yield delta
                continue
            delta.finish_reason = _FINISH.get(str(reason), "stop")
            # vLLM's servers say which stop string matched (`stop_reason`); others do not.
            stop = choice.get("stop_reason")
            delta.stop_sequence = stop if isinstance(stop, str) else None
            self.held.append(delta)


def token_count(value: Any, most: int) -> int | None:
    """A token count an upstream reported (absent: 0), or None when it cannot be one: not a
    whole number, negative, or above `most`."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if value != value or not 0 <= value <= most or value != int(value):
        return None
    return int(value)


def _plain_chunk(data: str) -> bool:
    """Whether an event is a choice chunk with no finish reason, usage or error: the
    markers are looked for as compact JSON writes them, outside strings (where every quote
    is escaped, so none can match). A server that writes spaced JSON has every event parsed,
    and so has one cut short (an event broken by a line end within it)."""
    return (
        '"finish_reason":null' in data
        and '"usage":{' not in data
        and '"error":' not in data
        and data.endswith("}")
    )


def _empty_text(data: str) -> bool:
    """Whether a plain chunk carries no text (a chat stream's opening `role` chunk)."""
    return '"content":""' in data or '"text":""' in data or '"content":null' in data


def _framed(events: list[str]) -> str:
    return "".join(f"data: {data}\n\n" for data in events)


def _choice_text(choice: Mapping[str, Any], records: bool) -> str:
    if "text" in choice:  # completions
        return str(choice.get("text") or "")
    delta = choice.get("delta") or {}
    content = delta.get("content")
    if not records:
        return str(content or "")
    parts = []
    if content:
        parts.append(encode_content(content))
    for call in delta.get("tool_calls") or ():
        function = call.get("function") or {}
        parts.append(
            encode_call_fragment(
                int(call.get("index") or 0), function.get("name"), function.get("arguments") or ""
            )
        )
    return "".join(parts)


def _logprobs(raw: Any) -> list[TokenLogprob] | None:
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("content"), list):  # chat
        return [
            TokenLogprob(
                str(e.get("token", "")),
                e.get("logprob"),
                tuple(
                    (str(t.get("token", "")), t.get("logprob")) for t in e.get("top_logprobs") or ()
                ),
            )
            for e in raw["content"]
        ]
    tokens = raw.get("tokens")
    if isinstance(tokens, list):  # completions
        values = raw.get("token_logprobs") or []
        tops = raw.get("top_logprobs") or []
        return [
            TokenLogprob(
                str(token),
                values[i] if i < len(values) else None,
                tuple((tops[i] or {}).items()) if i < len(tops) else (),
            )
            for i, token in enumerate(tokens)
        ]
    return None


class UpstreamStreamError(Exception):
    """An upstream sent an error event in its stream."""

    def __init__(self, error: Any) -> None:
        message = error.get("message") if isinstance(error, dict) else str(error)
        super().__init__(message or "the upstream reported an error")


def error_fields(raw: bytes) -> tuple[str | None, str | None, str | None]:
    """An upstream's error body: the message, param and code of OpenAI's shape (None where
    absent), or the text or FastAPI `detail` of another."""
    try:
        data = json.loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace").strip()[:500]
        return text or None, None, None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, str):
        return error, None, None
    if not isinstance(error, dict):
        detail = data.get("detail") if isinstance(data, dict) else None
        return (str(detail) if detail else None), None, None
    param, code = error.get("param"), error.get("code")
    return (
        str(error.get("message") or "") or None,
        str(param) if param is not None else None,
        str(code) if code is not None else None,
    )

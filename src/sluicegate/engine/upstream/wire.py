"""Our prompts and sampling options as OpenAI request bodies; upstream SSE as engine steps.

Every request goes upstream streamed, with `stream_options.include_usage`, whatever the
client asked: one parser serves both, and a non-streamed client answer is assembled by the
gateway as for the in-process engine. Parameters at their OpenAI default are left out, so an
upstream that does not know vLLM's extensions (`top_k`, `min_p`, ...) is not sent them
unless the client asked for them.

Reasoning: the request's reasoning fields go as vLLM's server takes them, and an assistant
turn's thoughts under both names servers read (`reasoning`, vLLM's; `reasoning_content`,
llama.cpp's and DeepSeek's). The answer's thoughts are read under either name, from a
stream's `delta` or a whole answer's `message`, and its `completion_tokens_details.
reasoning_tokens` counted on the finishing delta.
"""

from __future__ import annotations

import json
import logging
import re
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
    PromptImage,
    ReasoningOptions,
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
    model: str,
    prompt: Prompt,
    options: SamplingOptions,
    explicit_max_tokens: bool = True,
    forward_urls: bool = False,
) -> tuple[str, dict[str, Any]]:
    """The path (under /v1) and the JSON body for the upstream. Images go inline (`data:`
    URIs), or with `forward_urls` those the gateway fetched by the client's URL."""
    body: dict[str, Any] = {"model": model}
    chat = prompt.chat
    if chat is not None:
        path = "/chat/completions"
        images = iter(prompt.images)
        body["messages"] = [wire_message(m, images, forward_urls) for m in chat.messages]
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
    if chat is not None and options.reasoning is not None:
        _reasoning(body, options.reasoning)
    return path, body


def _reasoning(body: dict[str, Any], reasoning: ReasoningOptions) -> None:
    """vLLM's reasoning fields, each only when the request set it, as it set it: an upstream
    merges the effort into its template's kwargs itself (vLLM does), and one that takes no
    `chat_template_kwargs` (OpenAI's API refuses fields it does not know) gets none unless
    the client sent them."""
    if reasoning.effort is not None:
        body["reasoning_effort"] = reasoning.effort
    kwargs = reasoning.sent_kwargs()
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    if not reasoning.include:
        body["include_reasoning"] = False
    if reasoning.budget is not None:
        body["thinking_token_budget"] = reasoning.budget


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


def wire_message(
    message: Mapping[str, Any],
    images: Iterator[PromptImage] | None = None,
    forward_urls: bool = False,
) -> dict[str, Any]:
    """A message as OpenAI's wire has it: tool-call arguments as JSON text (templates take
    them parsed). An assistant's thoughts go under the name the client sent them with
    (`reasoning`, vLLM's; `reasoning_content`, llama.cpp's): DeepSeek's API refuses
    `reasoning_content` in input and OpenAI's fields it does not know, so none is added.
    A message with images (`parts`) takes the next of `images` for each; without `images`
    (a count of its text) it goes as its text alone."""
    wired = dict(message)
    parts = wired.pop("parts", None)
    if parts is not None and images is not None:
        wired["content"] = [_wire_part(part, images, forward_urls) for part in parts]
    calls = message.get("tool_calls")
    if not calls:
        return wired
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


def _wire_part(
    part: Mapping[str, Any], images: Iterator[PromptImage], forward_urls: bool
) -> dict[str, Any]:
    if part["type"] != "image":
        return {"type": "text", "text": part["text"]}
    image = next(images)
    url = image.url if forward_urls and image.url is not None else image.data_uri()
    wired: dict[str, Any] = {"url": url}
    if image.detail is not None:
        wired["detail"] = image.detail
    return {"type": "image_url", "image_url": wired}


def _arguments_text(arguments: object) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    """`completion_tokens_details.reasoning_tokens`: of the completion tokens, those the
    upstream's reasoning parser counted as thoughts (0 when it did not say)."""


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
    thought: dict[int, int] = field(default_factory=dict)
    """Chunks with reasoning, by choice: how the usage's reasoning tokens are shared out
    between several choices (`finish`)."""
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
                found.reasoning += delta.reasoning
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

    def feed_answer(self, data: str) -> EngineStep | None:
        """A whole answer (an upstream that answered the streamed request with one JSON
        body, as for `stream: false`): its choices' `message`s, finishing, and its usage.
        Parsed even when passing through: there are no events to hand on."""
        event = self._event(data)
        self.done = True
        if event is None:
            return None
        deltas = list(self._deltas(event.get("choices") or ()))
        return EngineStep(choices=deltas) if deltas else None

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
            details = usage.get("completion_tokens_details")
            thought = token_count(
                details.get("reasoning_tokens") if isinstance(details, dict) else None,
                completion or 0,
            )
            if prompt is None or completion is None:
                # Negative counts would be refunds to the key's budget and quotas, absurd
                # ones charges it never ran up: the gateway's own counts stand instead.
                logger.warning("an upstream reported a usage that cannot be: %.200r", usage)
            else:
                # More thoughts than output cannot be: the output stands, the thoughts not.
                self.usage = Usage(prompt, completion, thought or 0)
        return event

    def finish(self) -> EngineStep:
        """The last step: the held finishing deltas, with the counts settled."""
        usage = self.usage
        if usage is not None and self.held and self.choices == 1:
            counted = sum(self.counted.values())
            self.held[0].num_tokens += usage.completion_tokens - counted
        if usage is not None and usage.reasoning_tokens and self.held:
            self._share_reasoning(usage.reasoning_tokens)
        return EngineStep(
            choices=self.held,
            prompt_tokens=0 if usage is None else usage.prompt_tokens,
            finished=True,
        )

    def _share_reasoning(self, total: int) -> None:
        """The usage's reasoning tokens (one number for all choices) on the finishing deltas:
        a choice's share in proportion to its chunks with reasoning (a token each, as the
        stream counts them), the rounding's remainder on the first; all on the first when no
        chunk had any (an upstream that counts thoughts it does not send)."""
        held = sorted(self.held, key=lambda d: d.index)
        weights = [self.thought.get(d.index, 0) for d in held]
        seen = sum(weights)
        if not seen:
            held[0].reasoning_tokens += total
            return
        shares = [total * w // seen for w in weights]
        shares[0] += total - sum(shares)
        for delta, share in zip(held, shares, strict=True):
            delta.reasoning_tokens += share

    def _deltas(self, choices: Any) -> Iterator[ChoiceDelta]:
        for choice in choices:
            index = int(choice.get("index") or 0)
            text = _choice_text(choice, self.records)
            thought = _choice_reasoning(choice)
            reason = choice.get("finish_reason")
            logprobs = _logprobs(choice.get("logprobs"))
            # A chunk of thoughts is output too: a token, as one of text.
            tokens = 1 if text or thought or logprobs else 0
            if logprobs:
                tokens = len(logprobs)
            self.counted[index] = self.counted.get(index, 0) + tokens
            if thought:
                self.thought[index] = self.thought.get(index, 0) + 1
            delta = ChoiceDelta(index, text, tokens, None, logprobs, reasoning=thought)
            if reason is None:
                if text or thought or logprobs:
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
    """Whether a plain chunk carries no text (a chat stream's opening `role` chunk): no
    content, and no thoughts beside it (llama.cpp writes `"content":null` with them)."""
    return (
        '"content":""' in data or '"text":""' in data or '"content":null' in data
    ) and _THOUGHT.search(data) is None


_THOUGHT = re.compile(r'"reasoning(?:_content)?":"[^"]')
"""A non-empty thought in compact JSON (outside strings, where quotes are escaped)."""


def _framed(events: list[str]) -> str:
    return "".join(f"data: {data}\n\n" for data in events)


def _message(choice: Mapping[str, Any]) -> Mapping[str, Any]:
    """A chat choice's delta (streamed) or message (a whole answer)."""
    message = choice.get("delta")
    if message is None:
        message = choice.get("message")
    return message if isinstance(message, dict) else {}


def _choice_reasoning(choice: Mapping[str, Any]) -> str:
    """A chat choice's thoughts: vLLM's `reasoning`, else `reasoning_content` (llama.cpp's,
    DeepSeek's API's, older vLLM's); one of them when a server writes both."""
    if "text" in choice:  # completions: no reasoning parser splits them
        return ""
    message = _message(choice)
    thought = message.get("reasoning")
    if not isinstance(thought, str) or not thought:
        thought = message.get("reasoning_content")
    return thought if isinstance(thought, str) else ""


def _choice_text(choice: Mapping[str, Any], records: bool) -> str:
    if "text" in choice:  # completions
        return str(choice.get("text") or "")
    delta = _message(choice)
    content = delta.get("content")
    if not records:
        return str(content or "")
    parts = []
    if content:
        parts.append(encode_content(content))
    for position, call in enumerate(delta.get("tool_calls") or ()):
        function = call.get("function") or {}
        # A whole message's calls have no `index`: their place in the list is theirs.
        index = call.get("index")
        parts.append(
            encode_call_fragment(
                int(index if index is not None else position),
                function.get("name"),
                function.get("arguments") or "",
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

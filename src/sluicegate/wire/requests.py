"""OpenAI request models, validated with pydantic.

Requests are parsed strictly enough that every bad value becomes a 400 naming its parameter:
NaN and Infinity are refused, numbers are range-checked (never beyond what the engine stores:
int32 for `top_k`, int64 elsewhere), text with a lone UTF-16 surrogate (`"\\ud800"` in JSON) is
refused, and parameters we do not implement are refused when set rather than silently ignored.
Unknown extra fields are ignored, as OpenAI's API and vLLM's server do.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, NoReturn

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from sluicegate.engine.protocol import ReasoningOptions
from sluicegate.wire.tools import (
    FunctionCall,
    FunctionCallChoice,
    FunctionDefinition,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    ToolLimits,
    ToolSetup,
    resolve_tools,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_N = 128
"""The largest `n` any setting can allow (`SLUICEGATE_MAX_N` picks a smaller one)."""
MAX_TOP_LOGPROBS = 20
MAX_MESSAGES = 16384
"""The most messages (or Responses input items) a request may hold, whatever the settings
(`SLUICEGATE_MAX_MESSAGES` picks fewer). Large bodies are validated in a worker process, then
validated again on the event loop in their compact form: this bounds that second pass (about
3 ms per thousand messages) however many the body held."""
MAX_PROMPTS = 4096
"""The most prompts one completion request may batch, whatever the settings (as above)."""
MAX_LOGIT_BIAS = 1024
"""Entries one `logit_bias` may hold (each is a row of vLLM's bias tensor, per sequence)."""
Truncation = Literal["auto", "disabled"]
"""Whether a prompt that leaves too little room is truncated (see `inference.budget`)."""
Overflow = Literal["clamp", "error"]
"""What a `max_tokens` above what the context leaves gets: lowered, or a 400."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, protected_namespaces=())


RequestModel = _Model
"""The base of request models in other modules (`wire.tokenize`)."""


# JSON can spell half of a UTF-16 pair (`"\\ud800"`); `json.loads` turns a whole pair into one
# code point, so any surrogate left in a parsed string is a lone one. Such text cannot be
# encoded: the tokenizer, the cache and every JSON answer that echoes it would fail.
LONE_SURROGATE = (
    "text is not valid Unicode: it holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
    "escape)"
)
Loc = tuple[str | int, ...]


def _lone_surrogate(text: str) -> bool:
    """C-speed: `isascii` is O(1) in CPython; other text is encoded once (a few ms per MB)."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:  # UTF-8 encodes every code point but surrogates
        return True
    return False


def _check_texts(texts: list[str], where: Callable[[int], Loc] = lambda i: (i,)) -> None:
    """Refuse the first of `texts` holding a lone surrogate, at `where(index)`: its location
    relative to the field being validated, so that the error's `param` names it (`stop.1`).

    The texts are checked as one joined string; only a refused request is walked again."""
    if not _lone_surrogate("".join(texts)):
        return
    index = next(i for i, text in enumerate(texts) if _lone_surrogate(text))
    _refuse(where(index), texts[index])


def _refuse(loc: Loc, text: str) -> NoReturn:
    error = PydanticCustomError("invalid_unicode", LONE_SURROGATE)
    raise ValidationError.from_exception_data(
        "text", [InitErrorDetails(type=error, loc=loc, input=text)]
    )


def check_text(value: str | list[str]) -> None:
    if isinstance(value, str):
        _check_texts([value], lambda _: ())
    else:
        _check_texts(value)


TEXT_ONLY = (
    "this model takes text only: content parts of type '{type}' are not supported "
    "(send 'text' parts)"
)
IMAGE_DETAILS = ("auto", "low", "high")


class ImageURL(_Model):
    """An `image_url` part's image: an http(s) URL or a `data:` URI (fetched or decoded by the
    gateway, `media`)."""

    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ContentPart(_Model):
    """One part of a message's content: `text` parts, `image_url` parts in user messages, and
    in assistant messages `refusal` parts (read as their text, as vLLM's server does). Any
    other type (`input_audio`, `file`, ...) is refused by `ChatMessage`; an image by a model
    that takes text only (`inference.images`)."""

    type: str
    text: str | None = None
    refusal: str | None = None
    image_url: ImageURL | None = None

    @property
    def value(self) -> str:
        """The part's text ("" for an image)."""
        return (self.text if self.type == "text" else self.refusal) or ""

    @property
    def field(self) -> str:
        """The field holding the part's content."""
        return {"text": "text", "image_url": "image_url"}.get(self.type, "refusal")


def _part_error(loc: Loc, kind: str, message: str, **context: str) -> NoReturn:
    error = PydanticCustomError(kind, message, dict(context))
    raise ValidationError.from_exception_data(
        "content", [InitErrorDetails(type=error, loc=loc, input=None)]
    )


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    function_call: FunctionCall | None = None
    """Legacy: an assistant message's one call (`tool_calls` replaced it)."""
    reasoning: str | None = None
    """An assistant turn's thoughts, handed to the template (which may drop them)."""
    reasoning_content: str | None = None
    """The same under its older name (DeepSeek's API, llama.cpp; vLLM's server reads it as
    `reasoning`, which wins when both are sent). Kept under the name it came with, so an
    upstream gets what its client sent (DeepSeek's API refuses `reasoning_content` in input,
    OpenAI's fields it does not know); templates get both names (`engine.tokenizer`)."""

    @property
    def thought(self) -> str | None:
        """The turn's thoughts, under either name."""
        return self.reasoning if self.reasoning is not None else self.reasoning_content

    @field_validator("content")
    @classmethod
    def _text_parts_only(
        cls, value: str | list[ContentPart] | None, info: ValidationInfo
    ) -> str | list[ContentPart] | None:
        if not isinstance(value, list):
            return value
        role = info.data.get("role")
        for j, part in enumerate(value):
            if part.type == "refusal" and role != "assistant":
                _part_error(
                    (j,),
                    "unsupported_content",
                    "refusal parts are only allowed in assistant messages",
                )
            if part.type == "image_url" and role != "user":
                _part_error((j,), "unsupported_content", "images are read in user messages only")
            if part.type not in ("text", "refusal", "image_url"):
                _part_error((j,), "unsupported_content", TEXT_ONLY, type=part.type)
            if getattr(part, part.field) is None:
                _part_error(
                    (j, part.field), "missing", f"a '{part.type}' part needs '{part.field}'"
                )
        return value

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        role = self.role
        if self.content is None and role != "assistant":
            raise ValueError(f"a {role} message needs content")
        if role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id: the id of the call it answers")
        if role == "function" and not self.name:
            raise ValueError("a function message needs the function's name")
        if role != "assistant" and (self.tool_calls is not None or self.function_call):
            raise ValueError("only assistant messages carry tool_calls or function_call")
        if role != "assistant" and self.thought is not None:
            raise ValueError("only assistant messages carry reasoning")
        if self.tool_calls is not None and self.function_call is not None:
            raise ValueError("send either tool_calls or the deprecated function_call, not both")
        return self

    def other_texts(self) -> list[tuple[Loc, str]]:
        """The texts of the message's fields beyond content and name (its tool fields and
        reasoning), located within the message."""
        located: list[tuple[Loc, str]] = []
        for j, call in enumerate(self.tool_calls or ()):
            located += [
                (("tool_calls", j, "id"), call.id),
                (("tool_calls", j, "function", "name"), call.function.name),
                (("tool_calls", j, "function", "arguments"), call.function.arguments),
            ]
        if self.function_call is not None:
            located += [
                (("function_call", "name"), self.function_call.name),
                (("function_call", "arguments"), self.function_call.arguments),
            ]
        if self.tool_call_id is not None:
            located.append((("tool_call_id",), self.tool_call_id))
        if self.reasoning is not None:
            located.append((("reasoning",), self.reasoning))
        if self.reasoning_content is not None:
            located.append((("reasoning_content",), self.reasoning_content))
        return located

    def has_images(self) -> bool:
        return isinstance(self.content, list) and any(p.type == "image_url" for p in self.content)

    def prompt_message(self) -> dict[str, Any]:
        """The message as chat templates take it: content as text (and, in a message with
        images, `parts`: its text and image parts in order, each image `{"type": "image"}`, for
        the engine's template to place: `ChatMessages`), `developer` as `system`,
        legacy `function` messages and `function_call` as tool messages and `tool_calls`,
        call arguments as JSON values where they parse (templates write them as JSON)."""
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        message: dict[str, Any] = {"role": role, "content": self.text()}
        if isinstance(self.content, list) and self.has_images():
            message["parts"] = [
                {"type": "image"} if p.type == "image_url" else {"type": "text", "text": p.value}
                for p in self.content
            ]
        if self.name is not None and self.role in ("tool", "function"):
            message["name"] = self.name
        if self.tool_call_id is not None and role == "tool":
            message["tool_call_id"] = self.tool_call_id
        if self.reasoning is not None:
            message["reasoning"] = self.reasoning
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        calls = self.tool_calls
        if self.function_call is not None:
            calls = [ToolCall(id="call_0", function=self.function_call)]
        if calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": _json(c.function.arguments)},
                }
                for c in calls
            ]
        return message

    def refused_texts(self, index: int) -> list[tuple[Loc, str]]:
        """The message's texts holding a lone surrogate, located as in a request where it is
        `messages[index]`."""
        content = self.content
        located: list[tuple[Loc, str]] = []
        if isinstance(content, str):
            located.append(((index, "content"), content))
        elif content is not None:
            located += [
                ((index, "content", j, p.field), p.value)
                for j, p in enumerate(content)
                if p.type != "image_url"
            ]
        if self.name is not None:
            located.append(((index, "name"), self.name))
        located += [((index, *loc), text) for loc, text in self.other_texts()]
        return [(loc, text) for loc, text in located if _lone_surrogate(text)]

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.value for part in self.content if part.type != "image_url")


def check_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Refuse a conversation holding a lone surrogate, naming where."""
    # One check over the whole conversation (a validator per message would cost more than
    # the check); only a refused one is walked again to say where.
    texts: list[str] = []
    for message in messages:
        content = message.content
        if isinstance(content, str):
            texts.append(content)
        elif content is not None:
            texts += [part.value for part in content]
        if message.name is not None:
            texts.append(message.name)
        if (
            message.tool_calls
            or message.function_call
            or message.tool_call_id
            or message.thought is not None
        ):
            texts += [text for _, text in message.other_texts()]
    if _lone_surrogate("".join(texts)):
        _refuse(*next(found for i, m in enumerate(messages) for found in m.refused_texts(i)))
    return messages


ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
"""vLLM's `reasoning_effort` values (OpenAI's, and DeepSeek's `max`)."""
MAX_TEMPLATE_KWARGS_BYTES = 16384
"""The most `chat_template_kwargs` may hold, as JSON: the template reads them whole for every
prompt it renders, the budget's counts included."""
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "add_generation_prompt",
        "chat_template",
        "continue_final_message",
        "conversation",
        "conversations",
        "documents",
        "max_length",
        "messages",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "tokenize",
        "tokenizer_kwargs",
        "tools",
        "truncation",
    }
)
"""What the gateway itself gives the template, and the tokenizer's own arguments of
`apply_chat_template` (or what vLLM refuses): not a client's to set."""
MAX_TEMPLATE_KWARGS_DEPTH = 16
"""How deeply `chat_template_kwargs` may nest."""


def checked_template_kwargs(value: dict[str, Any]) -> dict[str, Any]:
    """`chat_template_kwargs`, refused when it names what the gateway sets, or is too big."""
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(value))
    if reserved:
        raise ValueError(
            f"chat_template_kwargs may not set {', '.join(reserved)}: the server sets it"
        )
    _check_json_values(value)
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if _lone_surrogate(text):
        raise ValueError(f"chat_template_kwargs: {LONE_SURROGATE}")
    if len(text.encode()) > MAX_TEMPLATE_KWARGS_BYTES:
        raise ValueError(
            f"chat_template_kwargs may hold at most {MAX_TEMPLATE_KWARGS_BYTES} bytes as JSON"
        )
    return value


def _check_json_values(value: dict[str, Any]) -> None:
    """Refuse what the engine core could not be sent (its messages are msgpack: integers
    within 64 bits) and nesting past `MAX_TEMPLATE_KWARGS_DEPTH`; iterative, so no depth
    can exhaust the stack."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if depth > MAX_TEMPLATE_KWARGS_DEPTH:
            raise ValueError(
                f"chat_template_kwargs may nest at most {MAX_TEMPLATE_KWARGS_DEPTH} levels deep"
            )
        if isinstance(item, dict):
            pending += [(v, depth + 1) for v in item.values()]
        elif isinstance(item, list):
            pending += [(v, depth + 1) for v in item]
        elif isinstance(item, int) and not INT64_MIN <= item <= INT64_MAX:
            raise ValueError("chat_template_kwargs: integers must lie within 64 bits")


def reasoning_options(
    effort: str | None,
    template_kwargs: dict[str, Any] | None,
    include: bool = True,
    budget: int | None = None,
) -> ReasoningOptions | None:
    """The engine's reasoning options for a request's fields; None when it set none (what
    the template gets is `ReasoningOptions.kwargs`)."""
    budget = None if budget == -1 else budget
    if effort is None and template_kwargs is None and include and budget is None:
        return None
    canonical = (
        None
        if template_kwargs is None
        else json.dumps(template_kwargs, sort_keys=True, ensure_ascii=False)
    )
    return ReasoningOptions(
        include=include, effort=effort, template_kwargs=canonical, budget=budget
    )


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """The messages as the chat template takes them (see `ChatMessage.prompt_message`)."""
    return [m.prompt_message() for m in messages]


class StreamOptions(_Model):
    include_usage: bool = False


JsonValue = dict[str, Any]


class JsonSchemaFormat(_Model):
    """`response_format.json_schema`, OpenAI's shape. The schema itself is checked (size,
    depth, JSON Schema, what the grammar engine supports) by `inference.structured`."""

    model_config = ConfigDict(populate_by_name=True)
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: JsonValue | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    """`response_format`: `text`, `json_object`, or `json_schema` with its `json_schema`."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_iff_json_schema(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("type 'json_schema' needs a json_schema object")
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(
                f"json_schema is only accepted with type 'json_schema', not {self.type!r}"
            )
        return self


class StructuredOutputsField(_Model):
    """vLLM's `structured_outputs` extension: one constraint kind of `json` (a schema, as an
    object or JSON text), `regex`, `choice`, `grammar` (EBNF or Lark) and `json_object`."""

    json_: JsonValue | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    # vLLM's options about whitespace and other backends: whitespace is a server setting
    # here (`inference.structured` compares), the rest are refused when set.
    disable_any_whitespace: bool | None = None
    disable_additional_properties: bool | None = None
    whitespace_pattern: str | None = None
    structural_tag: str | None = None

    model_config = ConfigDict(populate_by_name=True)

    @field_validator("regex", "grammar", "choice")
    @classmethod
    def _is_unicode(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is not None:
            check_text(value)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> StructuredOutputsField:
        for name in ("disable_additional_properties", "whitespace_pattern", "structural_tag"):
            if getattr(self, name) not in (None, False):
                raise ValueError(f"structured_outputs.{name} is not supported by this server")
        kinds = self.kinds()
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise ValueError(
                "exactly one of json, regex, choice, grammar and json_object must be set "
                f"(found: {found})"
            )
        if self.json_object is False:
            raise ValueError("json_object must be true when set")
        return self

    def kinds(self) -> list[str]:
        values = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object,
        }
        return [name for name, value in values.items() if value is not None]


class SamplingRequest(_Model):
    """Fields shared by chat and text completions."""

    model: str
    # Up to int64, what engines store; larger values are a 400, smaller ones are clamped to
    # what the context leaves (see inference/budget.py).
    max_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    # vLLM keeps top_k in an int32 tensor (and lowers any value above the vocabulary to it).
    top_k: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    min_p: float | None = Field(default=None, ge=0, le=1)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=10)
    user: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # vLLM extensions, kept because vLLM's benchmark and clients send them.
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=INT64_MAX)
    # vLLM's priority scheduling: lower runs first (see quota/share.py for what a key may ask).
    priority: int = Field(default=0, ge=INT32_MIN, le=INT32_MAX)
    logit_bias: dict[str, float] | None = None
    # sluicegate extension: fit a prompt that leaves too little room (see inference/budget.py).
    # Unset: the server's default (SLUICEGATE_TRUNCATION, SLUICEGATE_COMPLETION_TRUNCATION).
    truncation: Truncation | None = None
    # Structured outputs (see inference/structured.py): OpenAI's `response_format`, and vLLM's
    # `structured_outputs`, which vLLM's clients send (on both endpoints, as vLLM accepts).
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsField | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and any(s == "" for s in value):
            raise ValueError("stop sequences must not be empty strings")
        if value is not None:
            check_text(value)
        return value

    @field_validator("model", "user")
    @classmethod
    def _is_unicode(cls, value: str | None) -> str | None:
        if value is not None:
            check_text(value)
        return value

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias_ids(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        # Ids within the vocabulary are checked by the service, which knows its size.
        if not value:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} token ids may be biased")
        for key, bias in value.items():
            if not (key.isascii() and key.isdigit()) or len(key) > 18:
                raise ValueError(f"keys must be token ids (non-negative integers), not {key!r}")
            if not -100 <= bias <= 100:
                raise ValueError(f"biases must be in [-100, 100], not {bias} (token {key})")
        return value

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        """The bias as (token id, bias) pairs, in id order (so equal biases key alike)."""
        return tuple(sorted((int(k), v) for k, v in (self.logit_bias or {}).items()))

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(
        cls, value: StreamOptions | None, info: ValidationInfo
    ) -> StreamOptions | None:
        if value is not None and not info.data.get("stream"):
            raise ValueError("stream_options can only be set when stream is true")
        return value

    def completion_limit(self) -> int | None:
        return self.max_tokens

    def logprobs_k(self) -> int | None:
        """None: no logprobs; k: the sampled token's logprob plus the top k."""
        return None

    def stop_list(self) -> tuple[str, ...]:
        if self.stop is None or self.stop == "":
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


def _json(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


class ChatCompletionRequest(SamplingRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDefinition] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    functions: list[FunctionDefinition] | None = None
    function_call: FunctionCallChoice | None = None
    reasoning_effort: ReasoningEffort | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    include_reasoning: bool = True
    thinking_token_budget: int | None = Field(default=None, ge=-1, le=INT32_MAX)
    """vLLM's: the most tokens a reasoning model may think for; -1 (or none) for no bound."""
    # What a text-only model without search cannot give: refused, never silently ignored.
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    web_search_options: dict[str, Any] | None = None

    @field_validator("audio", "web_search_options")
    @classmethod
    def _unsupported(cls, value: dict[str, Any] | None, info: ValidationInfo) -> None:
        if value is not None:  # `web_search_options: {}` asks for a search
            raise ValueError(f"{info.field_name} is not supported by this server")
        return None

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and any(m != "text" for m in value):
            raise ValueError("this model answers in text only: modalities must be ['text']")
        return value

    @field_validator("messages")
    @classmethod
    def _messages_are_unicode(cls, value: list[ChatMessage]) -> list[ChatMessage]:
        return check_messages(value)

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value and not info.data.get("logprobs"):
            raise ValueError("top_logprobs requires logprobs to be true")
        return value

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else checked_template_kwargs(value)

    def completion_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def reasoning_options(self) -> ReasoningOptions | None:
        """The request's reasoning fields for the engine; None when it set none."""
        return reasoning_options(
            self.reasoning_effort,
            self.chat_template_kwargs,
            self.include_reasoning,
            self.thinking_token_budget,
        )

    def tool_setup(self, limits: ToolLimits) -> ToolSetup:
        """The tools offered and how they may be called (a 400 when the fields disagree)."""
        return resolve_tools(
            self.tools,
            self.tool_choice,
            self.parallel_tool_calls,
            self.functions,
            self.function_call,
            limits,
        )

    def prompt_messages(self) -> list[dict[str, Any]]:
        return template_messages(self.messages)

    def image_parts(self) -> list[tuple[str, ImageURL]]:
        """The request's images in order, each with its place (`messages.1.content.2`)."""
        found: list[tuple[str, ImageURL]] = []
        for i, message in enumerate(self.messages):
            if not isinstance(message.content, list):
                continue
            for j, part in enumerate(message.content):
                if part.type == "image_url" and part.image_url is not None:
                    found.append((f"messages.{i}.content.{j}", part.image_url))
        return found

    def logprobs_k(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


Prompt = (
    str
    | Annotated[list[str], Field(max_length=MAX_PROMPTS)]
    | list[int]
    | Annotated[list[list[int]], Field(max_length=MAX_PROMPTS)]
)


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    # 0 only with `echo`: the prompt is scored, nothing is generated (see `_zero_max_tokens`).
    max_tokens: int | None = Field(default=None, ge=0, le=INT64_MAX)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> None:
        if value:
            raise ValueError(
                "suffix is not supported by this server (the model has no fill-in-the-middle mode)"
            )
        return None

    @field_validator("best_of")
    @classmethod
    def _best_of_is_n(cls, value: int | None) -> int | None:
        if value not in (None, 1):
            raise ValueError(
                "best_of > 1 is not supported by this server; use n, and pick among the choices"
            )
        return value

    @model_validator(mode="after")
    def _zero_max_tokens(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            error = PydanticCustomError(
                "greater_than_equal",
                "max_tokens must be at least 1 (0 is accepted only with echo, to score the prompt)",
            )
            raise ValidationError.from_exception_data(
                "max_tokens", [InitErrorDetails(type=error, loc=("max_tokens",), input=0)]
            )
        return self

    @property
    def scores_only(self) -> bool:
        """`echo` with `max_tokens` 0: the prompt (and its logprobs) is the whole answer."""
        return self.echo and self.max_tokens == 0

    def prompt_logprobs_k(self) -> int | None:
        """What vLLM's server does: with `echo`, the prompt gets `logprobs` too."""
        return self.logprobs if self.echo else None

    @field_validator("prompt")
    @classmethod
    def _prompt_not_empty(cls, value: Prompt) -> Prompt:
        if isinstance(value, list) and (len(value) == 0 or any(v == [] for v in value)):
            raise ValueError("prompt must not be empty")
        if isinstance(value, str) or isinstance(value[0], str):  # texts are never mixed with ids
            check_text(value)
        return value

    def logprobs_k(self) -> int | None:
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a batch: each item one text, or one prompt's token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if all(isinstance(p, int) for p in prompt):
            return [[p for p in prompt if isinstance(p, int)]]
        return [p for p in prompt if not isinstance(p, int)]

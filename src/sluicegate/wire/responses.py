"""The Responses API request (`POST /v1/responses`) and its conversion to a chat request.

A Responses request runs through the chat pipeline: `chat_body` turns its instructions, its
conversation (the stored one of `previous_response_id`, then `input`) and its parameters
into the body of a chat completion request, in OpenAI's chat shapes (`tools`, `tool_choice`,
`response_format`, tool messages). Whatever the chat request accepts, the Responses API then
accepts; what it refuses comes back as a 400 naming the Responses parameter (`param_for`).

Reasoning: `reasoning.effort` becomes the chat request's `reasoning_effort`; `reasoning`
items in `input` become the reasoning of the assistant turn they belong to
(`wire.response_items`), their `encrypted_content` opened first with the gateway's seal
(`ResponsesRequest.opened`).

What this server cannot do is refused here, by name: built-in tools, background runs,
image/file/audio inputs, `include` values other than `reasoning.encrypted_content`,
conversations.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from sluicegate.wire.reasoning_seal import ReasoningSeal
from sluicegate.wire.requests import (
    INT64_MAX,
    MAX_MESSAGES,
    ReasoningEffort,
    Truncation,
    _check_texts,
    _Model,
)
from sluicegate.wire.response_items import Item as Item
from sluicegate.wire.response_items import (
    chat_messages,
    check_item,
    images_of,
    item_texts,
    opened,
)

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
ENCRYPTED_REASONING = "reasoning.encrypted_content"
"""The one `include` value this server produces: reasoning items carry their text sealed."""


class FunctionTool(_Model):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat(self) -> dict[str, Any]:
        """The tool in the chat shape (`{"type": "function", "function": {...}}`)."""
        function: dict[str, Any] = {"name": self.name}
        for name in ("description", "parameters", "strict"):
            value = getattr(self, name)
            if value is not None:
                function[name] = value
        return {"type": "function", "function": function}


class TextFormat(_Model):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = Field(default=None, max_length=64)
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: str | None = None
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_named(self) -> TextFormat:
        if self.type == "json_schema" and (self.name is None or self.schema_ is None):
            raise ValueError("a json_schema format needs a name and a schema")
        return self

    def response_format(self) -> dict[str, Any] | None:
        """The chat request's `response_format` (None for plain text)."""
        if self.type == "text":
            return None
        if self.type == "json_object":
            return {"type": "json_object"}
        json_schema: dict[str, Any] = {"name": self.name, "schema": self.schema_}
        if self.description is not None:
            json_schema["description"] = self.description
        if self.strict is not None:
            json_schema["strict"] = self.strict
        return {"type": "json_schema", "json_schema": json_schema}

    def echo(self) -> dict[str, Any]:
        """The format as the response object repeats it."""
        echoed = self.model_dump(by_alias=True, exclude_none=True)
        echoed["type"] = self.type
        return echoed


class TextOptions(_Model):
    format: TextFormat = Field(default_factory=TextFormat)
    verbosity: Literal["medium"] | None = None


ReasoningSummary = Literal["auto", "concise", "detailed"]


class Reasoning(_Model):
    effort: ReasoningEffort | None = None
    """The chat request's `reasoning_effort` (OpenAI's values, and DeepSeek's `max`)."""
    summary: ReasoningSummary | None = None
    """Accepted; no summary is made (a reasoning item's `summary` stays empty, as vLLM's)."""
    generate_summary: ReasoningSummary | None = None
    """`summary`'s deprecated name."""

    def echo(self) -> dict[str, Any]:
        return {"effort": self.effort, "summary": self.summary or self.generate_summary}


class ResponsesRequest(_Model):
    model: str
    input: Annotated[list[Item], Field(max_length=MAX_MESSAGES)] | str
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=INT64_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    tools: list[FunctionTool] = Field(default_factory=list)
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = True
    text: TextOptions = Field(default_factory=TextOptions)
    store: bool = True
    previous_response_id: str | None = Field(default=None, min_length=1, max_length=128)
    stream: bool = False
    metadata: dict[str, str] | None = None
    user: str | None = None
    truncation: Truncation = "disabled"
    reasoning: Reasoning | None = None
    include: list[str] | None = None
    """Only `reasoning.encrypted_content`; any other value is refused."""
    # What this server cannot do: refused when set (a 400 naming the parameter).
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    max_tool_calls: int | None = None
    top_logprobs: int | None = None
    service_tier: Literal["auto", "default"] | None = None

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, tool in enumerate(value):
                kind = tool.get("type") if isinstance(tool, dict) else None
                if kind != "function":
                    raise ValueError(
                        f"tools[{i}]: only function tools are supported by this server; "
                        f"built-in tools ({kind!r}) are not supported"
                    )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _known_tool_choice(cls, value: str | dict[str, Any]) -> str | dict[str, Any]:
        if isinstance(value, str):
            if value not in ("none", "auto", "required"):
                raise ValueError("tool_choice must be none, auto, required or a function")
        elif value.get("type") != "function" or not isinstance(value.get("name"), str):
            raise ValueError(
                "only {'type': 'function', 'name': ...} is supported as a tool_choice object"
            )
        return value

    @field_validator("background", "conversation", "prompt", "max_tool_calls", "top_logprobs")
    @classmethod
    def _not_supported(cls, value: Any) -> Any:
        if value not in (None, False):
            raise ValueError("not supported by this server")
        return value

    @field_validator("include")
    @classmethod
    def _includable(cls, value: list[str] | None) -> list[str] | None:
        for name in value or ():
            if name != ENCRYPTED_REASONING:
                raise ValueError(
                    f"{name!r} is not supported by this server (only {ENCRYPTED_REASONING!r} is)"
                )
        return value

    @property
    def seals_reasoning(self) -> bool:
        """Whether reasoning items carry their text sealed (`encrypted_content`)."""
        return ENCRYPTED_REASONING in (self.include or ())

    @field_validator("metadata")
    @classmethod
    def _metadata_bounded(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"at most {MAX_METADATA_PAIRS} pairs")
        for key, text in value.items():
            if len(key) > MAX_METADATA_KEY or len(text) > MAX_METADATA_VALUE:
                raise ValueError(
                    f"keys are at most {MAX_METADATA_KEY} and values at most "
                    f"{MAX_METADATA_VALUE} characters"
                )
        _check_texts([*value, *value.values()], lambda _: ())
        return value

    @field_validator("model", "instructions", "user")
    @classmethod
    def _is_unicode(cls, value: str | None) -> str | None:
        if value is not None:
            _check_texts([value], lambda _: ())
        return value

    @field_validator("input")
    @classmethod
    def _input_items(cls, value: str | list[Item]) -> str | list[Item]:
        if isinstance(value, str):
            _check_texts([value], lambda _: ())
            return value
        if not value:
            raise ValueError("input must not be empty")
        items = [check_item(item, i) for i, item in enumerate(value)]
        _check_texts([text for item in items for text in item_texts(item)], lambda _: ())
        return items

    def input_items(self) -> list[Item]:
        """`input` as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user", "content": self.input}]
        return self.input

    def opened(self, seal: ReasoningSeal) -> ResponsesRequest:
        """The request with its reasoning items' `encrypted_content` opened (`opened`)."""
        if isinstance(self.input, str):
            return self
        items = opened(self.input, seal)
        return self if items is self.input else self.model_copy(update={"input": items})

    def echo(self) -> dict[str, Any]:
        """The request's parameters as the response object repeats them."""
        return {
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "temperature": 1.0 if self.temperature is None else self.temperature,
            "top_p": 1.0 if self.top_p is None else self.top_p,
            "tools": [t.model_dump(exclude_none=True) for t in self.tools],
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "text": {"format": self.text.format.echo(), "verbosity": "medium"},
            "previous_response_id": self.previous_response_id,
            "store": self.store,
            "metadata": self.metadata or {},
            "truncation": self.truncation,
            "user": self.user,
            "reasoning": (self.reasoning or Reasoning()).echo(),
            "background": False,
            "service_tier": "default",
            "top_logprobs": 0,
            "max_tool_calls": None,
        }


def chat_body(request: ResponsesRequest, history: list[Item]) -> dict[str, Any]:
    """The chat completion request this Responses request runs as; `history` is the stored
    conversation of `previous_response_id` (its input and output items), else empty."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages([*history, *request.input_items()], request.instructions),
        "stream": request.stream,
        "truncation": request.truncation,
    }
    for name in ("temperature", "top_p", "user"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.max_output_tokens is not None:
        body["max_completion_tokens"] = request.max_output_tokens
    if request.reasoning is not None and request.reasoning.effort is not None:
        body["reasoning_effort"] = request.reasoning.effort
    if request.tools:
        body["tools"] = [tool.chat() for tool in request.tools]
        body["parallel_tool_calls"] = request.parallel_tool_calls
        choice = request.tool_choice
        body["tool_choice"] = (
            choice
            if isinstance(choice, str)
            else {"type": "function", "function": {"name": choice["name"]}}
        )
    elif request.tool_choice not in ("auto", "none"):
        body["tool_choice"] = request.tool_choice  # refused by the chat request: no tools
    response_format = request.text.format.response_format()
    if response_format is not None:
        body["response_format"] = response_format
    return body


_CHAT_TO_RESPONSES = {
    "messages": "input",
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
}


def image_params(history: list[Item], items: list[Item]) -> list[str]:
    """Where each image of the chat request is, in the chat's order: `input[1].content[2]`,
    or `previous_response_id` for one of the stored conversation (read again)."""
    places = ["previous_response_id" for item in history for _ in images_of(item)]
    for i, item in enumerate(items):
        places += [f"input[{i}].content[{j}]" for j, _ in images_of(item)]
    return places


def param_for(chat_param: str) -> str:
    """The Responses parameter behind a chat request's parameter (`messages.3.role` ->
    `input`, `response_format.json_schema` -> `text.format`)."""
    head = chat_param.split(".", 1)[0]
    return _CHAT_TO_RESPONSES.get(head, chat_param)

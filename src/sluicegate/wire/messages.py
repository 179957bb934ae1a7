"""Anthropic's Messages API request (`POST /v1/messages`) and its conversion to a chat request.

A Messages request runs through the chat pipeline: `chat_body` turns its system prompt, its
turns (text, `tool_use`, `tool_result` and `thinking` blocks) and its parameters into the body
of a chat completion request, in OpenAI's chat shapes: tool uses become an assistant turn's
`tool_calls`, tool results become `tool` turns, thinking blocks the turn's `reasoning`,
`tool_choice` `any` becomes `required` and a named tool a named function, `thinking` and
`output_config.effort` become `thinking_token_budget` and `reasoning_effort`
(`wire.message_thinking`, as vLLM's `/v1/messages` maps them). Whatever the chat request
accepts, this API then accepts; what it refuses comes back naming the Messages parameter
(`param_for`).

A thinking block comes back with the `signature` the gateway gave it
(`wire.reasoning_seal`): the conversion records each block's digest and signature
(`Converted.signed_thoughts`) for the route to verify, since it may run in a worker process
that holds no key.

Image blocks in user turns become the chat's `image_url` parts (base64 sources as `data:` URIs),
their places recorded (`Converted.image_params`) so that an image's error names the block.
What this server cannot do is refused here, by name: documents, images outside user turns,
server tools (web search, code execution), MCP servers. Unknown fields are ignored, as vLLM's
server ignores them.

A turn, and the system prompt, hold at most `MAX_CONTENT_BLOCKS` blocks each (a 400 past
it). A body large enough to be parsed in the worker process (`api.route.LargeBodyRoute`) is
converted there too (`Converted.converted`): what comes back to the event loop is the chat
request's turns, one string of content each (a list of parts with images), not the blocks
(nor the system prompt's, nor the tools), and the thinking blocks' digests and signatures.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NamedTuple, Self

from pydantic import (
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)

from sluicegate.wire.message_thinking import (
    OutputConfig,
    SignedThought,
    ThinkingConfig,
    checked_thinking,
    reasoning_fields,
)
from sluicegate.wire.reasoning_seal import text_digest
from sluicegate.wire.requests import MAX_MESSAGES, _Model

MAX_CONTENT_BLOCKS = 1024
"""The most content blocks one turn may hold (a 400 past it). Each block is converted one by
one; this bounds the blocks of a turn whatever the body's size."""

BILLING_HEADER = "x-anthropic-billing-header"
"""How the attribution block Claude Code puts in the system prompt begins: its hash changes
with each request, so it is left out (as vLLM's server leaves it out), or no two prompts
would share a prefix (nor a cached answer)."""

TEXT_ONLY = (
    "This model takes text only: {kind} blocks are not supported (send the text of the "
    "document, or use a model that reads them)."
)


class TextBlock(_Model):
    type: Literal["text"]
    text: str


def _bounded(value: Any, holder: str) -> Any:
    if isinstance(value, list) and len(value) > MAX_CONTENT_BLOCKS:
        raise ValueError(
            f"{holder} holds at most {MAX_CONTENT_BLOCKS} content blocks; this one has "
            f"{len(value)} (merge its text blocks"
            + (", or split it into turns)" if holder == "a turn" else ")")
        )
    return value


SystemPrompt = Annotated[
    str | list[TextBlock] | None,
    BeforeValidator(lambda value: _bounded(value, "the system prompt")),
]
"""`system`: a string, or at most `MAX_CONTENT_BLOCKS` text blocks."""


class ContentBlock(_Model):
    """A block of a turn's content, checked by its `type` (`blocks` in `Message`)."""

    model_config = _Model.model_config | {"extra": "allow"}
    type: str


class Message(_Model):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]

    @field_validator("content", mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        return _bounded(value, "a turn")

    def blocks(self) -> list[dict[str, Any]]:
        """The content as blocks (a string is one text block)."""
        if isinstance(self.content, str):
            return [{"type": "text", "text": self.content}]
        return [block.model_dump() for block in self.content]


class Tool(_Model):
    """A client tool (`type` `custom` or left out); server tools have other types."""

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None

    @model_validator(mode="after")
    def _client_tool(self) -> Tool:
        if self.type not in (None, "custom"):
            raise ValueError(
                f"server tools ({self.type}) are not supported here: give client tools, "
                "with name and input_schema"
            )
        if self.input_schema is None:
            raise ValueError("a tool needs its input_schema")
        return self

    def chat(self) -> dict[str, Any]:
        schema = dict(self.input_schema or {})
        schema.setdefault("type", "object")
        function: dict[str, Any] = {"name": self.name, "parameters": schema}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


class ToolChoice(_Model):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _named(self) -> ToolChoice:
        if self.type == "tool" and not self.name:
            raise ValueError("tool_choice of type tool needs the tool's name")
        return self

    def chat(self) -> str | dict[str, Any]:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Metadata(_Model):
    user_id: str | None = Field(default=None, max_length=256)


class UnsupportedBlockError(ValueError):
    """A content block this server cannot take; `param` says where it is."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Converted(_Model):
    """A request that runs as a chat request: its `chat_body`, converted on first use or
    already, in the worker process that parsed the body (`converted`)."""

    _chat: dict[str, Any] | tuple[str, str] | None = PrivateAttr(default=None)
    """The chat body, or what the conversion refused (message, param)."""
    _thoughts: tuple[SignedThought, ...] = PrivateAttr(default=())
    _images: tuple[str, ...] = PrivateAttr(default=())

    def convert(self) -> dict[str, Any]:
        raise NotImplementedError

    def image_params(self) -> tuple[str, ...]:
        """Where each image of the chat request is in this one (`messages.0.content.1`), in
        the chat's order (once `chat_body` has answered)."""
        return self._images

    def signed_thoughts(self) -> tuple[SignedThought, ...]:
        """The thinking blocks of the assistant turns, as the conversion found them (once
        `chat_body` has answered), for the route to verify."""
        return self._thoughts

    def chat_body(self) -> dict[str, Any]:
        """The chat request's body; raises `UnsupportedBlockError`."""
        if self._chat is None:
            return self.convert()
        if isinstance(self._chat, tuple):
            raise UnsupportedBlockError(*self._chat)
        return self._chat

    def converted(self) -> Self:
        """This request with its conversion done and its turns, system prompt and tools let
        go: what a worker process sends back, small to pickle (the chat turns are one string
        each)."""
        chat: dict[str, Any] | tuple[str, str]
        try:
            chat = self.convert()
        except UnsupportedBlockError as exc:
            chat = (str(exc), exc.param)
        # Nothing reads the blocks, the system prompt or the tools once converted: the
        # endpoint takes `chat_body`, `model` and `stream`.
        light = self.model_copy(update={"messages": [], "system": None, "tools": None})
        light._chat = chat
        return light


class MessagesRequest(Converted):
    model: str = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=2**63 - 1)
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: SystemPrompt = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0, le=2**31 - 1)
    metadata: Metadata | None = None
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    mcp_servers: list[Any] | None = None

    @field_validator("thinking", mode="wrap")
    @classmethod
    def _thinking(
        cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo
    ) -> Any:
        return checked_thinking(value, handler, info.data.get("max_tokens"))

    @model_validator(mode="after")
    def _supported(self) -> MessagesRequest:
        if self.mcp_servers:
            raise ValueError("mcp_servers are not supported here")
        return self

    def convert(self) -> dict[str, Any]:
        thoughts: list[SignedThought] = []
        images: list[str] = []
        body = chat_body(self, thoughts, images)
        self._thoughts = tuple(thoughts)
        self._images = tuple(images)
        return body


class CountTokensRequest(Converted):
    """`POST /v1/messages/count_tokens`: a Messages request without what only generation
    takes (`max_tokens` and the sampling parameters, which are ignored when given)."""

    model: str = Field(min_length=1)
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    system: SystemPrompt = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None

    @field_validator("thinking", mode="wrap")
    @classmethod
    def _thinking(cls, value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        return checked_thinking(value, handler)

    def convert(self) -> dict[str, Any]:
        """The chat request counted: its turns (thoughts included: the template renders them
        where it does, signed or not) and the effort the template is given."""
        fields = reasoning_fields(self.thinking, self.output_config)
        fields.pop("thinking_token_budget", None)  # it bounds generation, not the prompt
        images: list[str] = []
        messages = chat_messages(self.messages, self.system, images=images)
        self._images = tuple(images)
        return {
            "model": self.model,
            "messages": messages,
            **tool_fields(self.tools, self.tool_choice),
            **fields,
        }


def chat_body(
    request: MessagesRequest,
    thoughts: list[SignedThought] | None = None,
    images: list[str] | None = None,
) -> dict[str, Any]:
    """The chat completion request this Messages request runs as; the thinking blocks of its
    assistant turns are added to `thoughts`, the places of its images to `images`."""
    body: dict[str, Any] = {
        "model": request.model,
        "messages": chat_messages(request.messages, request.system, thoughts, images),
        "max_tokens": request.max_tokens,
        "stream": request.stream,
    }
    if request.stream:
        body["stream_options"] = {"include_usage": True}
    if request.stop_sequences:
        body["stop"] = request.stop_sequences
    for name in ("temperature", "top_p", "top_k"):
        value = getattr(request, name)
        if value is not None:
            body[name] = value
    if request.metadata is not None and request.metadata.user_id is not None:
        body["user"] = request.metadata.user_id
    body.update(tool_fields(request.tools, request.tool_choice))
    body.update(reasoning_fields(request.thinking, request.output_config))
    return body


def tool_fields(tools: list[Tool] | None, choice: ToolChoice | None) -> dict[str, Any]:
    """The chat request's `tools`, `tool_choice` and `parallel_tool_calls`."""
    fields: dict[str, Any] = {}
    if tools:
        fields["tools"] = [tool.chat() for tool in tools]
    if choice is not None and (tools or choice.type != "none"):
        fields["tool_choice"] = choice.chat()
        if choice.disable_parallel_tool_use is not None:
            fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return fields


def chat_messages(
    messages: list[Message],
    system: str | list[TextBlock] | None,
    thoughts: list[SignedThought] | None = None,
    images: list[str] | None = None,
) -> list[dict[str, Any]]:
    """The turns as chat messages: the system prompt first (without Claude Code's billing
    header), tool results as `tool` turns before the user text that came with them, image
    blocks as `image_url` parts among the user text (each place added to `images`), tool uses
    as the assistant turn's `tool_calls`, thinking blocks as its `reasoning` (each added to
    `thoughts`)."""
    chat: list[dict[str, Any]] = []
    if isinstance(system, list):
        system = "\n".join(b.text for b in system if not b.text.startswith(BILLING_HEADER))
    if system:
        chat.append({"role": "system", "content": system})
    found = [] if thoughts is None else thoughts
    places = [] if images is None else images
    for index, message in enumerate(messages):
        if message.role == "user":
            chat.extend(_user_turns(message, index, places))
        else:
            chat.append(_assistant_turn(message, index, found))
    return chat


def _user_turns(message: Message, index: int, images: list[str]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    pictured = False
    for position, block in enumerate(message.blocks()):
        kind = block.get("type")
        where = f"messages.{index}.content.{position}"
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "tool_result":
            turns.append(_tool_turn(block, where))
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block, where)}})
            images.append(where)
            pictured = True
        elif kind == "document":
            raise UnsupportedBlockError(TEXT_ONLY.format(kind=kind), where)
        else:
            raise UnsupportedBlockError(
                f"{kind!r} blocks are not supported in user turns (text, image and "
                "tool_result are)",
                where,
            )
    if pictured:
        turns.append({"role": "user", "content": parts})
    elif parts:
        turns.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
    return turns


def _image_url(block: dict[str, Any], where: str) -> str:
    """An image block's source as a chat image's URL: base64 data as a `data:` URI."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64" and isinstance(source, dict):
        media_type, data = source.get("media_type"), source.get("data")
        if isinstance(media_type, str) and isinstance(data, str):
            return f"data:{media_type};base64,{data}"
        raise UnsupportedBlockError(
            "a base64 image source needs its media_type and data (strings)", f"{where}.source"
        )
    if kind == "url" and isinstance(source, dict) and isinstance(source.get("url"), str):
        return str(source["url"])
    raise UnsupportedBlockError(
        "an image block's source is base64 (media_type, data) or url", f"{where}.source"
    )


def _assistant_turn(message: Message, index: int, thoughts: list[SignedThought]) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for position, block in enumerate(message.blocks()):
        kind = block.get("type")
        where = f"messages.{index}.content.{position}"
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        elif kind == "thinking":
            thought = _thought(block, where)
            reasoning.append(thought.text)
            thoughts.append(thought.signed)
        elif kind == "redacted_thinking":
            continue  # never written here: Anthropic's encrypted thoughts, opaque to a model
        elif kind == "image":
            raise UnsupportedBlockError("images are read in user turns only", where)
        elif kind == "document":
            raise UnsupportedBlockError(TEXT_ONLY.format(kind=kind), where)
        else:
            raise UnsupportedBlockError(
                f"{kind!r} blocks are not supported in assistant turns (text and tool_use are)",
                where,
            )
    turn: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if reasoning:
        # Several blocks are one text, as vLLM's server joins them.
        turn["reasoning"] = "".join(reasoning)
    if calls:
        turn["tool_calls"] = calls
    return turn


class _Thought(NamedTuple):
    text: str
    signed: SignedThought


def _thought(block: dict[str, Any], where: str) -> _Thought:
    text, signature = block.get("thinking"), block.get("signature")
    if not isinstance(text, str):
        raise UnsupportedBlockError(
            "a thinking block needs its thinking (a string)", f"{where}.thinking"
        )
    if not isinstance(signature, str):
        raise UnsupportedBlockError(
            "a thinking block needs the signature it was given (send the block back as it came)",
            f"{where}.signature",
        )
    return _Thought(text, SignedThought(f"{where}.signature", text_digest(text), signature))


def _text(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise UnsupportedBlockError("a text block needs its text (a string)", f"{where}.text")
    return text


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
        raise UnsupportedBlockError("a tool_use block needs its id and name", where)
    if not isinstance(arguments, dict):
        raise UnsupportedBlockError("a tool_use block's input is an object", f"{where}.input")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def _tool_turn(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise UnsupportedBlockError("a tool_result block needs its tool_use_id", where)
    content = block.get("content", "")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for position, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image":
                raise UnsupportedBlockError(
                    "images in tool results are not supported (send them in the user turn)",
                    f"{where}.content.{position}",
                )
            if kind == "document":
                raise UnsupportedBlockError(
                    TEXT_ONLY.format(kind=kind), f"{where}.content.{position}"
                )
            if kind != "text" or not isinstance(part.get("text"), str):
                raise UnsupportedBlockError(
                    "a tool_result's content is text blocks", f"{where}.content.{position}"
                )
            parts.append(part["text"])
        text = "\n".join(parts)
    else:
        raise UnsupportedBlockError("a tool_result's content is a string or blocks", where)
    if block.get("is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


_CHAT_TO_MESSAGES = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "user": "metadata.user_id",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "thinking_token_budget": "thinking.budget_tokens",
    "reasoning_effort": "output_config.effort",
}


def param_for(chat_param: str) -> str:
    """The Messages parameter behind a chat request's parameter (`stop` -> `stop_sequences`;
    chat message positions differ from the request's turns, so `messages.3` -> `messages`)."""
    head = chat_param.split(".", 1)[0]
    if head == "messages":
        return "messages"
    return _CHAT_TO_MESSAGES.get(head, chat_param)

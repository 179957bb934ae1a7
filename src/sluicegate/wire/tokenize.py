"""`/tokenize` and `/detokenize` request models, shaped as vLLM's server takes them.

A tokenize request holds either a `prompt` (text) or chat `messages` (rendered with the
model's chat template first); `add_special_tokens` defaults as in vLLM: on for a prompt, off
for messages (the template adds them).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from sluicegate.wire.requests import (
    INT64_MAX,
    MAX_MESSAGES,
    ChatMessage,
    RequestModel,
    check_messages,
    check_text,
    checked_template_kwargs,
    template_messages,
)


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    """The chat template's arguments (`enable_thinking`, ...), as for a chat completion."""
    # vLLM's chat tokenize also renders `tools`; counting without them would be wrong, so
    # they are refused rather than ignored.
    tools: list[Any] | None = None

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> None:
        if value:
            raise ValueError("tools are not supported by /tokenize on this server")
        return None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if value is None else checked_template_kwargs(value)

    @field_validator("messages")
    @classmethod
    def _messages_are_unicode(cls, value: list[ChatMessage] | None) -> list[ChatMessage] | None:
        return None if value is None else check_messages(value)

    @field_validator("model", "prompt")
    @classmethod
    def _is_unicode(cls, value: str | None) -> str | None:
        if value is not None:
            check_text(value)
        return value

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("send either prompt (text) or messages (a chat), not both")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    @property
    def special_tokens(self) -> bool:
        if self.add_special_tokens is not None:
            return self.add_special_tokens
        return self.messages is None

    def prompt_messages(self) -> list[dict[str, str]]:
        return template_messages(self.messages or [])


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=INT64_MAX)]]

    @field_validator("model")
    @classmethod
    def _is_unicode(cls, value: str | None) -> str | None:
        if value is not None:
            check_text(value)
        return value

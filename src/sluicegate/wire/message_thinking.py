"""Anthropic's `thinking` and `output_config` on a Messages request, as vLLM's `/v1/messages`
takes them, and the chat request's reasoning fields they become (`reasoning_fields`); a
thinking block sent back, as the route verifies it (`SignedThought`).

`thinking` is one of three: `enabled` with a `budget_tokens` of at least
`MIN_THINKING_BUDGET` and below `max_tokens` (`thinking_token_budget`), `disabled`
(`reasoning_effort` `none`), `adaptive` (nothing); `display` is taken and ignored.
`output_config.effort` is `reasoning_effort`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler
from pydantic_core import InitErrorDetails, PydanticCustomError

from sluicegate.wire.requests import INT32_MAX, _Model

MIN_THINKING_BUDGET = 1024
"""The least `thinking.budget_tokens` (Anthropic's and vLLM's bound)."""

ThinkingDisplay = Literal["summarized", "omitted", "updates"]


class ThinkingEnabled(_Model):
    """Thinking on, within `budget_tokens` (the chat request's `thinking_token_budget`).
    `display` is taken and ignored, as vLLM's server ignores it: the thoughts always come."""

    type: Literal["enabled"]
    budget_tokens: int = Field(ge=MIN_THINKING_BUDGET, le=INT32_MAX)
    display: ThinkingDisplay | None = None


class ThinkingDisabled(_Model):
    """Thinking off: the chat request's `reasoning_effort` `none`."""

    type: Literal["disabled"]


class ThinkingAdaptive(_Model):
    """The model thinks as deep as it chooses: nothing is set."""

    type: Literal["adaptive"]
    display: ThinkingDisplay | None = None


ThinkingConfig = Annotated[
    ThinkingEnabled | ThinkingDisabled | ThinkingAdaptive, Field(discriminator="type")
]


class OutputConfig(_Model):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    """The chat request's `reasoning_effort` (vLLM's values)."""


_THINKING_TAGS = (("enabled",), ("disabled",), ("adaptive",))


def checked_thinking(
    value: Any, handler: ValidatorFunctionWrapHandler, max_tokens: int | None = None
) -> Any:
    """`thinking` validated, its errors located as the parameters are named
    (`thinking.budget_tokens`: pydantic puts the union's tag in between), its budget below
    `max_tokens`."""
    try:
        thinking = handler(value)
    except ValidationError as exc:
        errors = [
            InitErrorDetails(
                type=PydanticCustomError(error["type"], error["msg"]),
                loc=error["loc"][1:] if error["loc"][:1] in _THINKING_TAGS else error["loc"],
                input=error["input"],
            )
            for error in exc.errors(include_url=False)
        ]
        raise ValidationError.from_exception_data(exc.title, errors) from None
    if (
        isinstance(thinking, ThinkingEnabled)
        and max_tokens is not None
        and thinking.budget_tokens >= max_tokens
    ):
        message = f"must be less than max_tokens ({max_tokens})"
        error = InitErrorDetails(
            type=PydanticCustomError("value_error", message),
            loc=("budget_tokens",),
            input=thinking.budget_tokens,
        )
        raise ValidationError.from_exception_data("thinking", [error])
    return thinking


def reasoning_fields(
    thinking: ThinkingConfig | None, output: OutputConfig | None
) -> dict[str, Any]:
    """The chat request's `reasoning_effort` and `thinking_token_budget`, as vLLM's server
    sets them: the effort of `output_config`, `none` when thinking is disabled; the budget
    when enabled; nothing for `adaptive`."""
    fields: dict[str, Any] = {}
    if output is not None and output.effort is not None:
        fields["reasoning_effort"] = output.effort
    if isinstance(thinking, ThinkingDisabled):
        fields["reasoning_effort"] = "none"
    elif isinstance(thinking, ThinkingEnabled):
        fields["thinking_token_budget"] = thinking.budget_tokens
    return fields


class SignedThought(NamedTuple):
    """A thinking block of an assistant turn, to verify: where it is (its signature's
    parameter), its text's digest, and the signature it came with."""

    param: str
    digest: bytes
    signature: str

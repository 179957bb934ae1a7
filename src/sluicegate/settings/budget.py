"""Token budget: how many completion tokens a request gets, and what is truncated when
the context is too small."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sluicegate.wire.requests import Overflow, Truncation


class BudgetSettings(BaseModel):
    """The token budget of a request."""

    # --- token budget ----------------------------------------------------------------
    truncation: Truncation = Field(
        default="auto",
        description="Chat requests that leave the completion less than its minimum: `auto` "
        "truncates the conversation, `disabled` answers 400. A request's `truncation` wins.",
    )
    completion_truncation: Truncation = Field(
        default="disabled",
        description="The same for /v1/completions: `auto` cuts the start of a prompt that is "
        "too long and keeps its end.",
    )
    budget_reserve_ratio: float = Field(
        default=0.3,
        ge=0,
        lt=1,
        description="Without a client max_tokens, the share of the context left after the "
        "prompt that the completion does not get.",
    )
    budget_default_max_tokens: int = Field(
        default=4096, ge=1, description="Most tokens a completion gets without a max_tokens."
    )
    budget_min_completion_tokens: int = Field(
        default=16,
        ge=1,
        description="Completion tokens the prompt must always leave (or the client's smaller "
        "max_tokens); a longer prompt is truncated.",
    )
    max_tokens_overflow: Overflow = Field(
        default="clamp",
        description="A max_tokens above what the context leaves: `clamp` lowers it, `error` "
        "answers 400 context_length_exceeded.",
    )

"""`thinking` and `output_config` as a Messages request takes them: the three kinds, the
budget's bounds refused naming `thinking.budget_tokens`, the chat fields they become."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from sluicegate.wire.message_thinking import (
    OutputConfig,
    ThinkingAdaptive,
    ThinkingDisabled,
    ThinkingEnabled,
    reasoning_fields,
)
from sluicegate.wire.messages import CountTokensRequest, MessagesRequest


def request(**extra: Any) -> MessagesRequest:
    return MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], **extra}
    )


@pytest.mark.parametrize(
    ("thinking", "says"),
    [
        ({"type": "enabled", "budget_tokens": 1023}, "greater than or equal to 1024"),
        ({"type": "enabled", "budget_tokens": 4096}, "less than max_tokens (4096)"),
        ({"type": "enabled", "budget_tokens": 5000}, "less than max_tokens (4096)"),
        ({"type": "enabled"}, "Field required"),
        ({"type": "enabled", "budget_tokens": 2000, "display": "loud"}, "'summarized'"),
        ({"type": "sometimes"}, "does not match any of the expected tags"),
    ],
)
def test_thinking_out_of_its_bounds_is_refused_naming_the_parameter(
    thinking: dict[str, Any], says: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        request(max_tokens=4096, thinking=thinking)
    (error,) = caught.value.errors()
    assert says in error["msg"]
    expected = ("thinking",) if thinking["type"] == "sometimes" else None
    if expected is None:
        field = "display" if "display" in thinking else "budget_tokens"
        expected = ("thinking", field)
    assert error["loc"] == expected


def test_count_tokens_bounds_the_budget_below_only() -> None:
    turns = [{"role": "user", "content": "hi"}]
    huge = {"type": "enabled", "budget_tokens": 100_000}
    assert CountTokensRequest(model="m", messages=turns, thinking=huge).thinking == ThinkingEnabled(
        type="enabled", budget_tokens=100_000
    )
    with pytest.raises(ValidationError) as caught:
        CountTokensRequest(model="m", messages=turns, thinking={**huge, "budget_tokens": 10})
    assert caught.value.errors()[0]["loc"] == ("thinking", "budget_tokens")


def test_each_kind_gives_the_chat_fields_vllm_gives() -> None:
    enabled = ThinkingEnabled(type="enabled", budget_tokens=2048, display="omitted")
    assert reasoning_fields(enabled, None) == {"thinking_token_budget": 2048}
    assert reasoning_fields(ThinkingDisabled(type="disabled"), None) == {"reasoning_effort": "none"}
    assert reasoning_fields(ThinkingAdaptive(type="adaptive"), None) == {}
    high = OutputConfig(effort="high")
    assert reasoning_fields(None, high) == {"reasoning_effort": "high"}
    assert reasoning_fields(enabled, high) == {
        "reasoning_effort": "high",
        "thinking_token_budget": 2048,
    }
    assert reasoning_fields(ThinkingDisabled(type="disabled"), high) == {"reasoning_effort": "none"}

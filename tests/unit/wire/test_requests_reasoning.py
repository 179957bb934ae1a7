"""Chat requests' reasoning fields, as vLLM's server reads them: `reasoning` (or the older
`reasoning_content`) on assistant turns, `reasoning_effort` and `chat_template_kwargs` merged
into what the template gets, `include_reasoning`, `thinking_token_budget`."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from sluicegate.engine.protocol import ReasoningOptions
from sluicegate.wire.requests import MAX_TEMPLATE_KWARGS_BYTES, ChatCompletionRequest


def _request(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields}
    )


def _error(**fields: Any) -> dict[str, Any]:
    with pytest.raises(ValidationError) as caught:
        _request(**fields)
    error: dict[str, Any] = caught.value.errors()[0]
    return error


@pytest.mark.parametrize("name", ["reasoning", "reasoning_content"])
def test_an_assistant_turn_keeps_its_thoughts_under_the_name_they_came_with(name: str) -> None:
    turns = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello", name: "Greet back."},
        {"role": "user", "content": "And?"},
    ]
    request = _request(messages=turns)
    assert request.messages[1].thought == "Greet back."
    message = request.prompt_messages()[1]
    assert message[name] == "Greet back."
    assert {"reasoning", "reasoning_content"} & set(message) == {name}
    assert "reasoning" not in request.prompt_messages()[0]


def test_reasoning_wins_over_reasoning_content_when_both_are_sent() -> None:
    turn = {"role": "assistant", "content": "", "reasoning": "new", "reasoning_content": "old"}
    request = _request(messages=[{"role": "user", "content": "Hi"}, turn])
    assert request.messages[1].thought == "new"


def test_only_an_assistant_turn_carries_reasoning() -> None:
    error = _error(messages=[{"role": "user", "content": "Hi", "reasoning": "no"}])
    assert error["loc"] == ("messages", 0) and "only assistant" in error["msg"]


def test_reasoning_with_a_lone_surrogate_is_refused_where_it_is() -> None:
    body = (
        '{"model": "m", "messages": [{"role": "user", "content": "Hi"},'
        ' {"role": "assistant", "content": "", "reasoning": "\\ud800"}]}'
    )
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(json.loads(body))
    assert caught.value.errors()[0]["loc"] == ("messages", 1, "reasoning")


def test_a_request_without_reasoning_fields_leaves_the_models_defaults() -> None:
    assert _request().reasoning_options() is None


def test_effort_reaches_the_template_and_turns_thinking_on_or_off() -> None:
    options = _request(reasoning_effort="none").reasoning_options()
    assert options is not None and options.effort == "none"
    assert options.kwargs() == {"reasoning_effort": "none", "enable_thinking": False}
    options = _request(reasoning_effort="high").reasoning_options()
    assert options is not None
    assert options.kwargs() == {"reasoning_effort": "high", "enable_thinking": True}


def test_the_clients_enable_thinking_is_kept_and_its_other_kwargs_pass() -> None:
    options = _request(
        reasoning_effort="low", chat_template_kwargs={"enable_thinking": False, "x": [1, 2]}
    ).reasoning_options()
    assert options is not None
    assert options.kwargs() == {"reasoning_effort": "low", "enable_thinking": False, "x": [1, 2]}


def test_template_kwargs_are_canonical_so_equal_requests_key_the_cache_alike() -> None:
    one = _request(chat_template_kwargs={"a": 1, "b": 2}).reasoning_options()
    two = _request(chat_template_kwargs={"b": 2, "a": 1}).reasoning_options()
    assert one == two and hash(one) == hash(two)
    assert one is not None and one.template_kwargs == json.dumps({"a": 1, "b": 2})


def test_include_reasoning_and_the_thinking_budget() -> None:
    assert _request(include_reasoning=False).reasoning_options() == ReasoningOptions(include=False)
    assert _request(thinking_token_budget=5).reasoning_options() == ReasoningOptions(budget=5)
    assert _request(thinking_token_budget=-1).reasoning_options() is None
    assert _error(thinking_token_budget=-2)["loc"] == ("thinking_token_budget",)


def test_an_unknown_effort_is_refused_naming_the_field() -> None:
    assert _error(reasoning_effort="extreme")["loc"] == ("reasoning_effort",)


@pytest.mark.parametrize("name", ["chat_template", "tokenize", "add_generation_prompt", "tools"])
def test_template_kwargs_may_not_set_what_the_server_sets(name: str) -> None:
    error = _error(chat_template_kwargs={name: "x"})
    assert error["loc"] == ("chat_template_kwargs",) and name in error["msg"]


def test_template_kwargs_are_bounded() -> None:
    error = _error(chat_template_kwargs={"x": "y" * MAX_TEMPLATE_KWARGS_BYTES})
    assert error["loc"] == ("chat_template_kwargs",) and "at most" in error["msg"]


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"date": "\ud800"}, "surrogate"),
        ({"n": 2**64}, "64 bits"),
        ({"deep": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}, "levels deep"),
        # Counted in bytes: 6,000 three-byte characters are 18,000 bytes.
        ({"x": "€" * 6000}, "at most"),
        ({"return_assistant_tokens_mask": True}, "may not set"),
    ],
)
def test_template_kwargs_the_engine_could_not_take_are_refused(
    kwargs: dict[str, Any], words: str
) -> None:
    error = _error(chat_template_kwargs=kwargs)
    assert error["loc"] == ("chat_template_kwargs",) and words in error["msg"]
